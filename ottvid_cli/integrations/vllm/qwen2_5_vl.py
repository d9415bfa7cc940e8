"""vLLM's Qwen2.5-VL with an ottvid method on each video's embeddings (docs/vllm.md). Imports vLLM.

`OTTVidQwen2_5_VL` subclasses vLLM's own model and processor; the plugin registers it under the
architecture name `Qwen2_5_VLForConditionalGeneration`. Without `ottvid_method` in hf_overrides, or
with `--video-pruning-rate` 0, every override below hands over to vLLM's own code (EVS included).
With it:
- the processor writes the method's own count of video placeholders (`pruning.retained`: round((1 - q) x V) for an
  exact method) before the encoder;
- the encoder's last block gives the saliency (mean attention each merged token receives), computed by
  that block's attention as it runs, as the transformers backbone does (`saliency.LastBlockSaliency`);
- the method compresses each video; the kept and merged tokens carry their roots' trained (t, h, w)
  positions and the next text's start, through vLLM's pruned-media path: our `recompute_mrope_positions`
  places them (`pruning.place`; vLLM's own function misplaces a second medium in one chunk), and
  `get_mrope_input_positions` gives the text after a video its trained place from the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.models.qwen2_5_vl import (
    Qwen2_5_VLDummyInputsBuilder,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLMultiModalProcessor,
    Qwen2_5_VLProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import PromptReplacement
from vllm.utils.gpu_sync_debug import gpu_sync_allowed

from ...backbones.positions import vision_positions
from . import pruning, settings
from .media import PlacedMedia
from .saliency import LastBlockSaliency


class OTTVidQwen2_5_VLProcessor(Qwen2_5_VLMultiModalProcessor):
    """vLLM's Qwen2.5-VL processor, with the ottvid method's placeholder count for each video."""

    def _get_prompt_updates(self, mm_items: Any, hf_processor_mm_kwargs: Mapping[str, Any],
                            out_mm_kwargs: Any) -> Sequence[Any]:
        updates = super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
        chosen = settings.for_processor(self)
        if chosen is None:
            return updates
        merge = self.info.get_image_processor(**hf_processor_mm_kwargs).merge_size
        hf_processor = self.info.get_hf_processor(**hf_processor_mm_kwargs)
        video_token = self.info.get_tokenizer().get_vocab()[hf_processor.video_token]

        def video_placeholders(item_idx: int) -> list[int]:
            t, h, w = (int(v) for v in out_mm_kwargs["video"][item_idx]["video_grid_thw"].data)
            return [video_token] * pruning.retained(chosen.method, chosen.config, t, (h // merge) * (w // merge))

        return [update if update.modality != "video"
                else PromptReplacement(modality="video", target=update.target, replacement=video_placeholders)
                for update in updates]


@MULTIMODAL_REGISTRY.register_processor(OTTVidQwen2_5_VLProcessor, info=Qwen2_5_VLProcessingInfo,
                                        dummy_inputs=Qwen2_5_VLDummyInputsBuilder)
class OTTVidQwen2_5_VL(PlacedMedia, LastBlockSaliency, Qwen2_5_VLForConditionalGeneration):
    """vLLM's Qwen2.5-VL; with `ottvid_method` set and q > 0, videos are compressed by that method."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.ottvid = settings.for_model(self.config, self.video_pruning_rate, self.use_data_parallel)
        self.ottvid_last: list[torch.Tensor] = []  # the last call's kept flat indices, one tensor a video (tests)
        self._saliency: list[torch.Tensor] | None = None

    # -- the encoder, with the saliency of its last block (saliency.LastBlockSaliency) ------------

    def _to_raster(self, merged: torch.Tensor, grid_thw: list[list[int]]) -> torch.Tensor:
        """The tower works in windows: its merged tokens come out in window order (`get_rope_by_thw`'s
        window index gives each one's raster slot)."""
        order, offset = [], 0
        merge = self.visual.spatial_merge_size
        for t, h, w in grid_thw:
            order.append(self.visual.get_rope_by_thw(int(t), int(h), int(w))[2] + offset)
            offset += int(t) * (int(h) // merge) * (int(w) // merge)
        return merged[torch.argsort(torch.cat(order).to(merged.device))]

    # -- compression and positions ---------------------------------------------------------------

    def _postprocess_video_embeds_evs(self, video_embeds_split: Sequence[torch.Tensor],
                                      video_input: Any) -> tuple[torch.Tensor, ...]:
        if self.ottvid is None:
            return super()._postprocess_video_embeds_evs(video_embeds_split, video_input)
        merge = self.visual.spatial_merge_size
        seconds = video_input.get("second_per_grid_ts")
        if seconds is None:
            raise ValueError("second_per_grid_ts is needed to place a compressed video's tokens in time")
        per_second = self.config.vision_config.tokens_per_second
        saliency = self._saliency
        out, self.ottvid_last = [], []
        for emb, (t, h, w), second, sal in zip(video_embeds_split, video_input["video_grid_thw"].tolist(),
                                               seconds.tolist(), saliency):
            with gpu_sync_allowed():  # the methods read a few counts back from the device
                rows, compressed = pruning.compress_video(emb, (t, h // merge, w // merge), sal, second, per_second,
                                                          self.ottvid.method, self.ottvid.config)
            out.append(rows)
            self.ottvid_last.append(compressed.index)
        self._saliency = None
        return tuple(out)

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """The prompt's first positions (`pruning.first_positions`): vLLM's own lay a compressed video's full
        grid over its fewer placeholders, and with them the text after it; ours put that text where the
        trained rule does, which is what it keeps when the video comes from the prefix cache."""
        if self.ottvid is None:
            return super().get_mrope_input_positions(input_tokens, mm_features)
        per_second = self.config.vision_config.tokens_per_second

        def following(grid: tuple[int, int, int], data: Any) -> int:  # the whole video's largest + 1
            seconds = data.get("second_per_grid_ts")
            second = float(seconds.data.reshape(-1)[0]) if seconds is not None else 1.0
            return int(vision_positions(0, grid, second, per_second).max()) + 1

        return pruning.prompt_positions(len(input_tokens), mm_features, self.config.vision_config.spatial_merge_size,
                                        following)
