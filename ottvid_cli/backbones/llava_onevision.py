"""LLaVA-OneVision (and converted LLaVA-Video) with OTT-Vid: saliency from the SigLIP tower's last
layer mapped onto the pooled grid, compression on the pooled tokens, the newline token kept.

transformers' `LlavaOnevisionForConditionalGeneration.get_video_features` runs SigLIP, the
projector and 2x2 bilinear pooling (27x27 -> 14x14 = 196 tokens a frame), then appends one
learned newline token after the whole video. Positions are plain 1-D and contiguous: dropping
tokens from the sequence is all that compression needs.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..timing import Stopwatch, synchronize
from .base import Generated, VisualTokens, attention_implementation, resolve_device, resolve_dtype
from .qwen2_5_vl import _FirstTokenClock
from .saliency import mean_attention_received


class LlavaOneVision:
    """Adapter for LlavaOnevisionForConditionalGeneration and its processor."""

    frames_per_group = 1
    default_frames = 32
    grounds = False  # the paper evaluates grounding on Qwen2.5-VL only

    def __init__(self, model, processor, name: str):
        self.model = model
        self.processor = processor
        self.name = name
        self.device = next(model.parameters()).device
        self.video_token_id = model.config.video_token_index
        vision = model.config.vision_config
        side = vision.image_size // vision.patch_size
        self.patch_grid = (side, side)
        self.grid = (math.ceil(side / 2), math.ceil(side / 2))  # apply_pooling's bilinear 2x downscale

    @classmethod
    def load(cls, model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
             max_pixels: int | None = None) -> "LlavaOneVision":
        from transformers import AutoProcessor, LlavaOnevisionForConditionalGeneration

        dev = resolve_device(device)
        model = LlavaOnevisionForConditionalGeneration.from_pretrained(
            model_id, dtype=resolve_dtype(dtype, dev), attn_implementation=attention_implementation(attention)
        ).to(dev).eval()
        return cls(model, AutoProcessor.from_pretrained(model_id), name=model_id)

    def preprocess(self, frames: np.ndarray, timestamps: list[float], duration: float, prompt: str) -> Any:
        """Frames (n, H, W, 3) uint8 and a prompt -> model inputs (the processor resizes to 384 x 384)."""
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = self.processor(text=[text], videos=[np.ascontiguousarray(frames)], return_tensors="pt")
        inputs = inputs.to(self.device)
        inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(self.model.dtype)
        return inputs

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
        try:
            with watch("vision"):
                out = self.model.model.get_video_features(pixel_values_videos=inputs["pixel_values_videos"])
        finally:
            for handle in handles:
                handle.remove()
        pooled = out.pooler_output[0]  # (T * 196 + 1, D): the frames' tokens, then the newline
        frames = inputs["pixel_values_videos"].shape[1]
        tokens = pooled[:-1].reshape(frames, self.grid[0] * self.grid[1], -1)
        sal = None
        if saliency:
            with watch("saliency"):
                sal = self._saliency(capture, frames)
        return VisualTokens(features=tokens, saliency=sal, grid=self.grid)

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
        pooled = F.interpolate(maps, size=list(self.grid), mode="bilinear")  # as apply_pooling does
        return pooled.reshape(t, -1).clamp_min(0.0)

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor) -> dict[str, Any]:
        """Inputs for generate() with only the kept visual tokens (in video order) and the newline token."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        video = ids == self.video_token_id
        keep = ~video
        for b in range(ids.shape[0]):
            slots = video[b].nonzero().flatten()
            keep[b, slots[kept.to(slots.device)]] = True
            keep[b, slots[-1]] = True  # the newline token after the video
        batch = ids.shape[0]
        newline = self.model.model.image_newline.to(features.device, self.model.dtype)[None]
        placed = torch.cat([features.to(self.model.dtype), newline])[None]
        return {"input_ids": ids[keep].view(batch, -1), "attention_mask": mask[keep].view(batch, -1),
                "mm_encoder_outputs": {"video": BaseModelOutputWithPooling(pooler_output=placed)}}

    @torch.inference_mode()
    def generate(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor, max_new_tokens: int = 64) -> Generated:
        llm = self.llm_inputs(inputs, features, kept)
        clock = _FirstTokenClock(self.device)
        tokenizer = self.processor.tokenizer
        start = time.perf_counter()
        out = self.model.generate(**llm, max_new_tokens=max_new_tokens, do_sample=False, streamer=clock,
                                  pad_token_id=tokenizer.pad_token_id)
        synchronize(self.device)
        end = time.perf_counter()
        new = out[:, llm["input_ids"].shape[1]:]
        text = tokenizer.batch_decode(new, skip_special_tokens=True)[0].strip()
        first = clock.first if clock.first is not None else end
        return Generated(text=text, llm_input_tokens=int(llm["input_ids"].shape[1]), new_tokens=int(new.shape[1]),
                         prefill_ms=(first - start) * 1e3, generate_ms=(end - first) * 1e3)

    @torch.inference_mode()
    def prefill(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor) -> int:
        llm = self.llm_inputs(inputs, features, kept)
        self.model(**llm, use_cache=True, logits_to_keep=1)
        return int(llm["input_ids"].shape[1])

    @torch.inference_mode()
    def prefill_logits(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        return self.model(**self.llm_inputs(inputs, features, kept)).logits

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]:
        from ..flops import llm_prefill_flops, siglip_video_flops

        frames = inputs["pixel_values_videos"].shape[1]
        config = self.model.config
        return (llm_prefill_flops(config.text_config, llm_tokens),
                siglip_video_flops(config.vision_config, frames, config.text_config.hidden_size))
