"""What the plugin's vLLM models share once a method is asked for: images carry the same position values
as compressed videos (`pruning.image_channels`), and every item of a prefill chunk is placed by the
model itself (`pruning.recompute`), not by vLLM's `recompute_mrope_positions` function (docs/vllm.md).
Without a method (`self.ottvid` None) each override hands over to vLLM's own code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from vllm.utils.gpu_sync_debug import gpu_sync_allowed

from . import pruning


class PlacedMedia:
    """Mixin for a vLLM Qwen-VL model with `self.ottvid`, `self.config` and `self.visual`."""

    def _postprocess_image_embeds_evs(self, image_embeds_split: Sequence[torch.Tensor],
                                      image_input: Any) -> tuple[torch.Tensor, ...]:
        if self.ottvid is None:
            return super()._postprocess_image_embeds_evs(image_embeds_split, image_input)
        merge = self.visual.spatial_merge_size
        return tuple(torch.cat([emb, pruning.image_channels((t, h // merge, w // merge), emb.dtype, emb.device)], 1)
                     for emb, (t, h, w) in zip(image_embeds_split, image_input["image_grid_thw"].tolist()))

    def recompute_mrope_positions(self, input_ids: Any, multimodal_embeddings: Sequence[torch.Tensor],
                                  mrope_positions: torch.Tensor, num_computed_tokens: int) -> tuple:
        if self.ottvid is None:
            return super().recompute_mrope_positions(input_ids, multimodal_embeddings, mrope_positions,
                                                     num_computed_tokens)
        with gpu_sync_allowed():
            return pruning.recompute(input_ids, multimodal_embeddings, mrope_positions, num_computed_tokens,
                                     self.config.video_token_id, self.config.image_token_id)
