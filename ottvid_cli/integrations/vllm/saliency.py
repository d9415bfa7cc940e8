"""The saliency ottvid's methods read (paper Sec. 3.2), from the last block of vLLM's Qwen vision towers.

`LastBlockSaliency` is mixed into the plugin's Qwen2.5-VL and Qwen3-VL models (both towers' blocks use
vLLM's `Qwen2_5_VisionAttention`). Around the encoder it hooks the last block's attention (its rotary
cos / sin and `cu_seqlens`) and its qkv layer, then recomputes softmax(q k^T / sqrt(d)) within the
block's segments as the transformers backbone does (`backbones.saliency.mean_attention_received`):
mean over heads and queries of the attention each patch receives, summed over each merge unit (its
patches are consecutive in the tower's order). `_to_raster` puts the merged values in raster order
(Qwen2.5-VL's tower works in windows; Qwen3-VL's is already in raster order).
"""

from __future__ import annotations

from typing import Any

import torch

from ...backbones.saliency import mean_attention_received


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
        attn = self.visual.blocks[-1].attn

        def grab(module: Any, args: tuple, kwargs: dict) -> None:
            capture["cu_seqlens"] = kwargs["cu_seqlens"]
            capture["cos"], capture["sin"] = kwargs["rotary_pos_emb_cos"], kwargs["rotary_pos_emb_sin"]

        def grab_qkv(module: Any, args: tuple, output: Any) -> None:
            capture["qkv"] = output[0] if isinstance(output, tuple) else output

        handles = [attn.register_forward_pre_hook(grab, with_kwargs=True), attn.qkv.register_forward_hook(grab_qkv)]
        try:
            embeds = super()._process_video_input(video_input)
        finally:
            for handle in handles:
                handle.remove()
        self._saliency = self._saliency_of(capture, video_input["video_grid_thw"].tolist())
        return embeds

    def _saliency_of(self, capture: dict[str, Any], grid_thw: list[list[int]]) -> list[torch.Tensor]:
        """Each video's (V,) mean attention its merged tokens receive in the last vision block."""
        attn = self.visual.blocks[-1].attn
        heads, head_dim = attn.num_attention_heads_per_partition, attn.hidden_size_per_attention_head
        qkv = capture["qkv"].reshape(capture["qkv"].shape[0], 3, heads, head_dim)  # (s, 3, H, d), b = 1
        qk = attn.apply_rotary_emb(qkv[:, :2].permute(1, 0, 2, 3).contiguous(), capture["cos"], capture["sin"])
        bounds = [int(v) for v in capture["cu_seqlens"].tolist()]
        received = mean_attention_received(qk[0], qk[1], bounds, head_dim**-0.5)  # (s,) the tower's order
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
