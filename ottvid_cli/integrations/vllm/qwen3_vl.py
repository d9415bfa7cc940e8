"""vLLM's Qwen3-VL (dense and MoE) with an ottvid method on each video's embeddings (docs/vllm.md). Imports vLLM.

`OTTVidQwen3VL` and `OTTVidQwen3VLMoe` subclass vLLM's own models; the plugin registers them under
`Qwen3VLForConditionalGeneration` and `Qwen3VLMoeForConditionalGeneration`, with `OTTVidQwen3VLProcessor`.
Without `ottvid_method` in hf_overrides, or with `--video-pruning-rate` 0, every override hands over to
vLLM's own code (EVS included). With it:
- the processor sizes each video's lumped placeholder (all its video tokens in the first group's block,
  as vLLM's EVS does) to the method's own count (`pruning.retained`: round((1 - q) x V) for an exact method) before the encoder runs;
- the last vision block gives the saliency (`saliency.LastBlockSaliency`);
- the method compresses each video's main features; every DeepStack level follows the same decisions
  (`Compressed.apply`, as `backbones.qwen3_vl` does); the model returns the whole placeholder laid out as
  ottvid_cli lays it out: each group's `<t seconds><|vision_start|>` + the tokens kept from it +
  `<|vision_end|>` (`qwen3_layout.video_layout`), with text embeddings for the timestamps and markers;
- every row carries its trained position (text its uncompressed one, a kept or merged token its root's)
  and `recompute_mrope_positions` places them (`pruning.place`), vLLM's own function not used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.models.qwen3_vl import (
    Qwen3VLDummyInputsBuilder,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMultiModalProcessor,
    Qwen3VLProcessingInfo,
)
from vllm.model_executor.models.qwen3_vl_moe import Qwen3VLMoeForConditionalGeneration, Qwen3VLMoeProcessingInfo
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import PromptReplacement, PromptUpdateDetails
from vllm.utils.gpu_sync_debug import gpu_sync_allowed

from . import pruning, qwen3_layout, settings
from .media import PlacedMedia
from .saliency import LastBlockSaliency


class OTTVidQwen3VLProcessor(Qwen3VLMultiModalProcessor):
    """vLLM's Qwen3-VL processor, with the ottvid method's placeholder count in each video's lumped block."""

    def _ottvid_counts(self, grids: Sequence[Sequence[int]]) -> list[int] | None:
        """Each video's placeholder count for the method asked for; None without one."""
        chosen = settings.for_processor(self)
        if chosen is None:
            return None
        merge = self.info.get_hf_config().vision_config.spatial_merge_size
        return [pruning.retained(chosen.method, chosen.config, int(t), (int(h) // merge) * (int(w) // merge)) for t, h, w in grids]

    def _expands_only_video_token(self, hf_processor: Any) -> bool:
        """False, with a method or without: the group blocks replace the template's whole
        `<|vision_start|><|video_pad|><|vision_end|>` as Qwen3-VL was trained, as transformers 5.25's
        processor does and as ottvid_cli's adapter lays the prompt out. vLLM's own answer follows the
        installed processor, and with transformers 5.10 to 5.24 keeps an outer pair the model never saw
        (docs/qwen3_vl.md); so a Qwen3-VL prompt is the same whichever transformers vLLM runs with."""
        return False

    def _apply_hf_processor_main(self, mm_items: Any, hf_kwargs: Mapping[str, object]) -> Any:
        processed = super()._apply_hf_processor_main(mm_items, hf_kwargs)
        grids = processed.get("video_grid_thw")
        counts = None if grids is None else self._ottvid_counts(grids.tolist())
        if counts is None or "input_ids" not in processed:
            return processed
        ids = processed["input_ids"]
        rows = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        video_token = self.info.get_hf_config().video_token_id
        resized = [qwen3_layout.resize_video_runs(rows[0], video_token, counts)]
        processed["input_ids"] = torch.tensor(resized, dtype=ids.dtype) if isinstance(ids, torch.Tensor) else resized
        return processed

    def _get_prompt_updates(self, mm_items: Any, hf_processor_mm_kwargs: Mapping[str, Any],
                            out_mm_kwargs: Any) -> Sequence[Any]:
        updates = super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
        if settings.for_processor(self) is None:
            return updates
        video_token = self.info.get_hf_config().video_token_id

        def sized(replacement: Any) -> Any:
            def video(item_idx: int) -> PromptUpdateDetails:
                grid = out_mm_kwargs["video"][item_idx]["video_grid_thw"].data.tolist()
                details = replacement(item_idx)
                (count,) = self._ottvid_counts([grid])
                return PromptUpdateDetails.from_seq(qwen3_layout.resize_video_runs(details.full, video_token, [count]))

            return video

        return [update if update.modality != "video"
                else PromptReplacement(modality="video", target=update.target, replacement=sized(update.replacement))
                for update in updates]


class _OTTVidQwen3(PlacedMedia, LastBlockSaliency):
    """What the dense and MoE models share: the overrides of vLLM's pruned-media path."""

    def _ottvid_init(self) -> None:
        self.ottvid = settings.for_model(self.config, self.video_pruning_rate, self.use_data_parallel)
        self.ottvid_last: list[torch.Tensor] = []  # the last call's kept flat indices, one tensor a video (tests)
        self.ottvid_layout: list[list[int]] = []  # the last call's item token ids as the LLM gets them (tests)
        self._saliency: list[torch.Tensor] | None = None

    def _postprocess_video_embeds_evs(self, video_embeds_split: Sequence[torch.Tensor],
                                      video_input: Any) -> tuple[torch.Tensor, ...]:
        if self.ottvid is None:
            return super()._postprocess_video_embeds_evs(video_embeds_split, video_input)
        merge = self.visual.spatial_merge_size
        config = self.config
        out, self.ottvid_last, self.ottvid_layout = [], [], []
        for emb, (t, h, w), stamps, sal in zip(video_embeds_split, video_input["video_grid_thw"].tolist(),
                                               video_input.timestamps, self._saliency):
            grid = (t, h // merge, w // merge)
            with gpu_sync_allowed():  # the methods, and the layout's group counts, read a few values back
                compressed = pruning.run_method(emb[:, :self.visual_dim], grid, sal, self.ottvid.method,
                                                self.ottvid.config)
                item = self._ottvid_item(grid, stamps).to(emb.device)
                ids, values = qwen3_layout.video_layout(item, config.video_token_id, config.vision_start_token_id,
                                                        grid, compressed.index)
            is_video = ids == config.video_token_id
            text = self.get_language_model().embed_input_ids(ids)  # timestamps and markers: text embeddings
            main = text.to(emb.dtype).masked_scatter(is_video[:, None], compressed.features.to(emb.dtype))
            parts = [main]
            if emb.shape[1] > self.visual_dim:  # DeepStack levels: the same combination of rows as the main ones
                levels = compressed.apply(emb[:, self.visual_dim:]).to(emb.dtype)
                parts.append(levels.new_zeros(ids.numel(), levels.shape[1]).masked_scatter(is_video[:, None], levels))
            parts.append(pruning.encode_positions(values, emb.dtype))
            out.append(torch.cat(parts, 1))
            self.ottvid_last.append(compressed.index)
            self.ottvid_layout.append(ids.tolist())
        self._saliency = None
        return tuple(out)

    def _ottvid_item(self, grid: tuple[int, int, int], timestamps: Any) -> torch.Tensor:
        """The uncompressed item's token ids: each group's `<t seconds><|vision_start|>` + H' W' video
        tokens + `<|vision_end|>`, as vLLM's processor writes it (`get_video_repl`)."""
        config = self.config
        return torch.tensor(Qwen3VLMultiModalProcessor.get_video_repl(
            tokens_per_frame=[grid[1] * grid[2]] * grid[0], timestamps=timestamps, tokenizer=self._tokenizer,
            vision_start_token_id=config.vision_start_token_id, vision_end_token_id=config.vision_end_token_id,
            video_token_id=config.video_token_id).full)

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """The prompt's first positions (`pruning.first_positions`): vLLM's own give a lumped run shorter
        than a group a whole group's positions (more columns than the prompt has tokens), and the text
        after it the lumped layout's; ours put that text where the trained rule does, which is what it
        keeps when the video comes from the prefix cache."""
        if self.ottvid is None:
            return super().get_mrope_input_positions(input_tokens, mm_features)
        def following(grid: tuple[int, int, int], data: Any) -> int:  # the uncompressed item's largest + 1
            item = self._ottvid_item(grid, data["timestamps"].data)
            return int(qwen3_layout.item_positions(item, self.config.video_token_id, grid).max()) + 1

        return pruning.prompt_positions(len(input_tokens), mm_features, self.config.vision_config.spatial_merge_size,
                                        following)


@MULTIMODAL_REGISTRY.register_processor(OTTVidQwen3VLProcessor, info=Qwen3VLProcessingInfo,
                                        dummy_inputs=Qwen3VLDummyInputsBuilder)
class OTTVidQwen3VL(_OTTVidQwen3, Qwen3VLForConditionalGeneration):
    """vLLM's Qwen3-VL; with `ottvid_method` set and q > 0, videos are compressed by that method."""

    def __init__(self, *, vllm_config: Any, prefix: str = "model") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._ottvid_init()


@MULTIMODAL_REGISTRY.register_processor(OTTVidQwen3VLProcessor, info=Qwen3VLMoeProcessingInfo,
                                        dummy_inputs=Qwen3VLDummyInputsBuilder)
class OTTVidQwen3VLMoe(_OTTVidQwen3, Qwen3VLMoeForConditionalGeneration):
    """vLLM's Qwen3-VL-MoE; with `ottvid_method` set and q > 0, videos are compressed by that method."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._ottvid_init()
