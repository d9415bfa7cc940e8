"""The saliency ottvid's methods read (paper Sec. 3.2), from the last block of vLLM's Qwen vision towers.

`LastBlockSaliency` is mixed into the plugin's Qwen2.5-VL and Qwen3-VL models (both towers' blocks use
vLLM's `Qwen2_5_VisionAttention`, which projects and rotates q and k, then calls its attention submodule
`attn`, an `MMEncoderAttention`, with them and `cu_seqlens`). While a video is encoded, that submodule of
the last block is replaced (`nn.Module.set_submodule`, put back after) by `RecordingAttention`, which
attends within the same segments as the transformers backbone's packed attention does and computes,
from the same pass over the scores, the attention each patch receives
(`backbones.attention.packed_sdpa_saliency`): mean over heads and queries, then summed over each merge
unit (its patches are consecutive in the tower's order). `_to_raster` puts the merged values in raster
order (Qwen2.5-VL's tower works in windows; Qwen3-VL's is already in raster order).
"""

from __future__ import annotations

from typing import Any

import torch

from ...backbones.attention import packed_sdpa_saliency


class RecordingAttention(torch.nn.Module):
    """Stands in for a vision block's `MMEncoderAttention` (`inner`): attention within the `cu_seqlens`
    segments of one packed sequence (query, key, value (1, s, H, d) -> (1, s, H, d)), whose received
    attention per token (s,) goes to `record["received"]`. Other calls go to `inner`."""

    def __init__(self, inner: torch.nn.Module, record: dict[str, Any]):
        super().__init__()
        self.inner = inner
        self.record = record

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if cu_seqlens is None or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
            return self.inner(query, key, value, cu_seqlens=cu_seqlens, **kwargs)
        out, self.record["received"] = packed_sdpa_saliency(query[0], key[0], value[0], cu_seqlens, self.inner.scale)
        return out.unsqueeze(0)


class LastBlockSaliency:
    """Mixin for a vLLM Qwen-VL model (`self.visual`, `self.ottvid`): with a method asked for,
    `_process_video_input` runs vLLM's encoder and keeps each video's (V,) saliency, raster order, in
    `self._saliency`; without one it is vLLM's own."""

    def _process_video_input(self, video_input: Any) -> tuple[torch.Tensor, ...]:
        if self.ottvid is None:
            return super()._process_video_input(video_input)
        if video_input["type"] != "pixel_values_videos":
            raise ValueError(f"ottvid_method {self.ottvid.method} compresses videos given as frames (the vision "
                             f"encoder's attention is its saliency), not as precomputed embeddings")
        capture: dict[str, Any] = {}
        name = f"blocks.{len(self.visual.blocks) - 1}.attn.attn"
        inner = self.visual.get_submodule(name)
        self.visual.set_submodule(name, RecordingAttention(inner, capture))
        try:
            embeds = super()._process_video_input(video_input)
        finally:
            self.visual.set_submodule(name, inner)
        self._saliency = self._saliency_of(capture, video_input["video_grid_thw"].tolist())
        return embeds

    def _saliency_of(self, capture: dict[str, Any], grid_thw: list[list[int]]) -> list[torch.Tensor]:
        """Each video's (V,) mean attention its merged tokens receive in the last vision block."""
        if "received" not in capture:
            raise RuntimeError("the last vision block's attention was not called with one packed sequence: "
                               "no saliency recorded")
        attn = self.visual.blocks[-1].attn
        heads = attn.num_attention_heads_per_partition
        received = capture["received"]  # (s,) the tower's order
        if attn.tp_size > 1:  # each rank holds heads / tp of them: average over all heads
            from vllm.distributed import tensor_model_parallel_all_reduce

            received = tensor_model_parallel_all_reduce(received * heads) / (heads * attn.tp_size)
        merged = received.reshape(-1, self.visual.spatial_merge_unit).sum(-1)  # one value per merged token
        raster = self._to_raster(merged, grid_thw)
        unit = self.visual.spatial_merge_unit
        return list(raster.split([int(t) * int(h) * int(w) // unit for t, h, w in grid_thw]))

    def _to_raster(self, merged: torch.Tensor, grid_thw: list[list[int]]) -> torch.Tensor:
        """Merged values in the tower's output order -> raster order (t, row, col); the identity here."""
        return merged
