"""LLaVA-OneVision (and converted LLaVA-Video) with OTT-Vid: saliency from the SigLIP tower's last
layer mapped onto the pooled grid, compression on the pooled tokens, the newline token kept.

transformers' `LlavaOnevisionForConditionalGeneration.get_video_features` runs SigLIP, the
projector and 2x2 bilinear pooling (27x27 -> 14x14 = 196 tokens a frame), then appends one
learned newline token after the whole video. Positions are plain 1-D and contiguous: dropping
tokens from the sequence is all that compression needs.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..timing import Stopwatch
from .base import (KeptTokenGeneration, VisualTokens, attention_implementation, chat_text, resolve_device,
                   resolve_dtype)
from .saliency import mean_attention_received


class LlavaOneVision(KeptTokenGeneration):
    """Adapter for LlavaOnevisionForConditionalGeneration and its processor."""

    frames_per_group = 1
    default_frames = 32
    grounds = False  # the paper evaluates grounding on Qwen2.5-VL only
    # `--preset official`: the authors' LLaVA path rounds K (llava_vid.py `_run_spatial_llava`)
    official_overrides = {"k_rounding": "round"}

    def __init__(self, model, processor, name: str, settings: dict | None = None):
        """settings: a converted LLaVA-Video checkpoint's own pooling and newline rules (ottvid.json);
        None for a transformers LLaVA-OneVision checkpoint (bilinear 2x, one newline per video)."""
        self.model = model
        self.processor = processor
        self.name = name
        self.settings = settings
        self.device = next(model.parameters()).device
        self.video_token_id = model.config.video_token_index
        vision = model.config.vision_config
        side = vision.image_size // vision.patch_size
        self.patch_grid = (side, side)
        if settings is None:
            self.pool_mode, self.pool_stride, self.newline_position = "bilinear", 2, "one_token"
        else:
            self.pool_mode = settings["mm_spatial_pool_mode"]
            self.pool_stride = int(settings["mm_spatial_pool_stride"])
            self.newline_position = settings["mm_newline_position"]
            self.default_frames = int(settings.get("frames", 64))
        if self.pool_mode == "bilinear":
            pooled = math.ceil(side / self.pool_stride)
        else:
            pooled = (side - self.pool_stride) // self.pool_stride + 1
        self.grid = (pooled, pooled)

    @classmethod
    def load(cls, model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
             max_pixels: int | None = None) -> "LlavaOneVision":
        from transformers import AutoProcessor, LlavaOnevisionForConditionalGeneration

        dev = resolve_device(device)
        model = LlavaOnevisionForConditionalGeneration.from_pretrained(
            model_id, dtype=resolve_dtype(dtype, dev), attn_implementation=attention_implementation(attention)
        ).to(dev).eval()
        settings_file = os.path.join(model_id, "ottvid.json")
        settings = json.loads(open(settings_file).read()) if os.path.isfile(settings_file) else None
        return cls(model, AutoProcessor.from_pretrained(model_id), name=model_id, settings=settings)

    def preprocess(self, frames: np.ndarray, timestamps: list[float], duration: float, prompt: str,
                   history: Sequence[tuple[str, str]] = ()) -> Any:
        """Frames (n, H, W, 3) uint8 and a prompt -> model inputs (the processor resizes to 384 x 384)."""
        text = chat_text(self.processor, prompt, history)
        inputs = self.processor(text=[text], videos=[np.ascontiguousarray(frames)], return_tensors="pt")
        self._fit_video_tokens(inputs, self.layout(len(frames)).numel())
        inputs = inputs.to(self.device)
        inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(self.model.dtype)
        return inputs

    def layout(self, frames: int) -> torch.Tensor:
        """The video's token sequence as the model lays it out: the flat index t*N + n of each visual
        token, -1 for a newline token ("grid": after every row of every frame; "frame": after every
        frame; "one_token": once after the video; "no_token": none)."""
        rows, cols = self.grid
        index = torch.arange(frames * rows * cols).view(frames, rows, cols)
        newline = torch.full((frames, rows, 1), -1)
        if self.newline_position == "grid":
            return torch.cat([index, newline], -1).reshape(-1)
        if self.newline_position == "frame":
            return torch.cat([index.reshape(frames, -1), newline[:, 0]], -1).reshape(-1)
        if self.newline_position == "one_token":
            return torch.cat([index.reshape(-1), torch.tensor([-1])])
        return index.reshape(-1)

    def newline_tokens(self, frames: int) -> int:
        """How many newline tokens the LLM input holds besides the visual tokens."""
        return int((self.layout(frames) < 0).sum())

    def _fit_video_tokens(self, inputs: Any, count: int) -> None:
        """Make the run of video placeholder tokens `count` long (the processor assumes the
        transformers layout: frames * 196 + 1)."""
        ids = inputs["input_ids"]
        slots = (ids[0] == self.video_token_id).nonzero().flatten()
        if slots.numel() == count:
            return
        start, end = int(slots[0]), int(slots[-1]) + 1
        run = torch.full((ids.shape[0], count), self.video_token_id, dtype=ids.dtype)
        inputs["input_ids"] = torch.cat([ids[:, :start], run, ids[:, end:]], 1)
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = torch.cat([mask[:, :start], torch.ones_like(run), mask[:, end:]], 1)

    def _pool(self, maps: torch.Tensor) -> torch.Tensor:
        """The checkpoint's spatial pooling on (B, C, H, W) maps (LLaVA-NeXT's get_2dPool)."""
        if self.pool_mode == "average":
            return F.avg_pool2d(maps, self.pool_stride)
        if self.pool_mode == "max":
            return F.max_pool2d(maps, self.pool_stride)
        return F.interpolate(maps, size=list(self.grid), mode="bilinear")

    @torch.inference_mode()
    def encode(self, inputs: Any, saliency: bool = True, watch: Stopwatch | None = None) -> VisualTokens:
        """Pooled visual tokens (T, 196, D) in raster order of the 14 x 14 grid, and their saliency."""
        watch = watch or Stopwatch(self.device)
        capture: dict[str, torch.Tensor] = {}
        handles = []
        if saliency:
            attn = self.last_vision_attention()
            handles = [attn.q_proj.register_forward_hook(lambda m, a, out: capture.__setitem__("q", out)),
                       attn.k_proj.register_forward_hook(lambda m, a, out: capture.__setitem__("k", out))]
        frames = inputs["pixel_values_videos"].shape[1]
        try:
            with watch("vision"):
                tokens = self._features(inputs["pixel_values_videos"])
        finally:
            for handle in handles:
                handle.remove()
        sal = None
        if saliency:
            with watch("saliency"):
                sal = self._saliency(capture, frames)
        return VisualTokens(features=tokens, saliency=sal, grid=self.grid)

    def _features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, T, 3, H, W) pixels -> (T, N, D) pooled, projected tokens in raster order."""
        frames = pixels.shape[1]
        if self.settings is None:  # transformers' own path: bilinear pooling, then one newline
            pooled = self.model.model.get_video_features(pixel_values_videos=pixels).pooler_output[0]
            return pooled[:-1].reshape(frames, self.grid[0] * self.grid[1], -1)
        config = self.model.config
        out = self.model.model.vision_tower(pixels.flatten(0, 1), output_hidden_states=True)
        hidden = out.hidden_states[config.vision_feature_layer]
        if config.vision_feature_select_strategy == "default":
            hidden = hidden[:, 1:]
        projected = self.model.model.multi_modal_projector(hidden)  # (T, S, D)
        maps = projected.transpose(1, 2).reshape(frames, -1, *self.patch_grid)
        return self._pool(maps).flatten(2).transpose(1, 2)

    def last_vision_attention(self):
        """The self-attention module of SigLIP's last encoder layer (the one whose output is used)."""
        tower = self.model.model.vision_tower
        tower = getattr(tower, "vision_model", tower)
        return tower.encoder.layers[-1].self_attn

    def _saliency(self, capture: dict[str, torch.Tensor], frames: int) -> torch.Tensor:
        """Attention each patch receives in SigLIP's last layer (mean over heads and queries, per
        frame, in query chunks), pooled onto the 14 x 14 grid with the model's own bilinear pooling."""
        attn = self.last_vision_attention()
        q, k = capture["q"], capture["k"]  # (T, S, C)
        t, s, _ = q.shape
        heads = attn.num_heads
        query = q.reshape(t * s, heads, -1)
        key = k.reshape(t * s, heads, -1)
        received = mean_attention_received(query, key, [i * s for i in range(t + 1)], attn.scale)
        maps = received.reshape(t, 1, *self.patch_grid)
        return self._pool(maps).reshape(t, -1).clamp_min(0.0)  # pooled like the features

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   compressed: Any = None) -> dict[str, Any]:
        """Inputs for generate() with only the kept visual tokens, each in its own slot of the model's
        layout, and every newline token where the model puts it. Positions stay 1-D and contiguous."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        frames = inputs["pixel_values_videos"].shape[1]
        layout = self.layout(frames).to(ids.device)
        slot_kept = (layout < 0) | torch.isin(layout, kept.to(ids.device))
        video = ids == self.video_token_id
        keep = ~video
        for b in range(ids.shape[0]):
            keep[b, video[b].nonzero().flatten()[slot_kept]] = True
        placed_layout = layout[slot_kept]
        newline = self.model.model.image_newline.to(features.device, self.model.dtype)
        placed = newline.expand(placed_layout.numel(), -1).clone()
        placed[placed_layout >= 0] = features.to(self.model.dtype)  # kept ascending = layout order
        batch = ids.shape[0]
        return {"input_ids": ids[keep].view(batch, -1), "attention_mask": mask[keep].view(batch, -1),
                "mm_encoder_outputs": {"video": BaseModelOutputWithPooling(pooler_output=placed[None])}}

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]:
        from ..flops import llm_prefill_flops, siglip_video_flops

        frames = inputs["pixel_values_videos"].shape[1]
        config = self.model.config
        return (llm_prefill_flops(config.text_config, llm_tokens),
                siglip_video_flops(config.vision_config, frames, config.text_config.hidden_size))
