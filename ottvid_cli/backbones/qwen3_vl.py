"""Qwen3-VL (dense and MoE) with OTT-Vid: the Qwen2.5-VL adapter's path, with what Qwen3-VL changes.

- Time is text: the processor writes `<t seconds>` before each temporal group's
  `<|vision_start|>` ... `<|vision_end|>` block. We pass our decoder's real frame times as the video
  metadata so that t is the mean of the group's two real timestamps. Compression drops video tokens
  only: every timestamp and marker stays, also around a group left with no token.
- The group blocks replace the chat template's whole `<|vision_start|><|video_pad|><|vision_end|>`, as
  the model was trained (`prompt_text`; transformers 5.10 to 5.24 kept that outer pair around them).
- M-RoPE has no time axis: each group is its own (1, H', W') grid (`positions.qwen3_vl_positions`).
- DeepStack: `get_video_features` also returns one tensor per `deepstack_visual_indexes`, added
  to the first LLM layers at the visual positions. `encode` returns them in
  `VisualTokens.extra["deepstack"]`; `llm_inputs(..., compressed=Compressed)` merges each layer with
  `compressed.apply`, the same linear combination of input rows as the main features got (uniform
  averages, or the method's own `mixing`), and passes them as `BaseModelOutputWithDeepstackFeatures`
  in `mm_encoder_outputs`.
- The vision tower has no window attention: every block attends within one temporal group, and its
  merged tokens come out in raster order.

Only transformers' own classes are used (`Qwen3VLForConditionalGeneration`,
`Qwen3VLMoeForConditionalGeneration`, `AutoProcessor`); no model class is patched. docs/qwen3_vl.md.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

import torch

from ..compression.types import Compressed
from .base import check_aspect
from .positions import qwen3_vl_positions
from .qwen2_5_vl import Qwen25VL, refuse_order

# 256 merged tokens per temporal group (16 x 16 at patch 16, merge 2): the token budget of the
# paper's Qwen2.5-VL setting (448 x 448 at patch 14).
DEFAULT_MAX_PIXELS = 512 * 512


class Qwen3VL(Qwen25VL):
    """Adapter for Qwen3VLForConditionalGeneration and Qwen3VLMoeForConditionalGeneration."""

    frames_per_group = 2  # temporal_patch_size
    default_frames = 32  # `ask`, as for Qwen2.5-VL (the paper's VQA setting); `ground` samples 2 fps
    grounds = True
    official_overrides: dict = {}
    method_defaults: dict = {}  # the peer methods' defaults are their Qwen2.5-VL paths already
    default_max_pixels = DEFAULT_MAX_PIXELS
    # lmms-eval's Qwen3-VL passes only min_pixels for a video (simple/qwen3_vl.py: video_kwargs): the
    # frame cap is then qwen-vl-utils' own (768 merged tokens, the video's total budget)
    lmms_pixels = {"min_pixels": 256 * 28 * 28, "max_pixels": 1 << 40}

    @classmethod
    def model_class(cls, model_id: str):
        from transformers import AutoConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration

        moe = AutoConfig.from_pretrained(model_id).model_type == "qwen3_vl_moe"
        return Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration

    # ----------------------------------------------------------------------------------------
    # preprocessing

    def frame_size(self, height: int, width: int, frames: int, max_pixels: int | None = None,
                   min_pixels: int | None = None) -> tuple[int, int]:
        """Target (height, width) of every frame, as `Qwen3VLVideoProcessor.resize` computes it with
        `cap_pixels_per_frame` (qwen-vl-utils' rule): per frame at most max_video_tokens merged
        tokens, the processor's total pixel budget over the frames, and `max_pixels`; at least 1.05 x
        the processor's minimum; then the processor's own `smart_resize` (factor patch x merge).
        `max_pixels` / `min_pixels` stand in for the backbone's own where given."""
        max_pixels = max_pixels or self.max_pixels
        min_pixels = min_pixels or self.min_pixels
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        check_aspect(height, width, "Qwen3-VL")
        vp = self.processor.video_processor
        factor = self.patch * self.merge
        per_frame = min(int(vp.max_video_tokens) * factor * factor, int(vp.size["longest_edge"]) // max(frames, 1),
                        int(max_pixels))
        least = int(min_pixels or vp.size["shortest_edge"])
        per_frame = max(per_frame, int(least * 1.05))
        # the processor's minimum bounds the whole clip; a `min_pixels` given (qwen-vl-utils') each frame
        minimum = int(min_pixels) * frames if min_pixels else least
        return smart_resize(frames, height, width, temporal_factor=self.frames_per_group, factor=factor,
                            min_pixels=minimum, max_pixels=per_frame * frames)

    def video_metadata(self, timestamps: list[float], duration: float, frames: int) -> dict[str, Any]:
        """Metadata that makes the processor's timestamps our real ones.

        `Qwen3VLProcessor._calculate_timestamps` takes `frames_indices[i] / fps` as frame i's time and
        writes each group's mean, `<{t:.1f} seconds>`. With fps 1 and our decoder's timestamps as the
        "indices", t is the mean of the group's two real timestamps (variable frame rate included); a
        padded last frame repeats the last timestamp, as the processor pads indices.
        """
        times = [float(t) for t in timestamps][:frames]
        times += [times[-1]] * (frames - len(times))
        return {"fps": 1.0, "frames_indices": times, "total_num_frames": frames, "duration": duration}

    def prompt_text(self, prompt: str, history: Sequence[tuple[str, str]] = ()) -> str:
        """The chat text with the template's `<|vision_start|><|video_pad|><|vision_end|>` made a bare
        `<|video_pad|>`, so that the processor's per-group blocks (`<t seconds><|vision_start|>` tokens
        `<|vision_end|>`) replace all three, as Qwen3-VL was trained (transformers 4.57's
        `Qwen3VLProcessor.__call__`; 5.25's `get_text_with_replacements` does the same). transformers 5.10
        to 5.24 expand only the pad, which left one more `<|vision_start|>` / `<|vision_end|>` around the
        blocks; made bare here, every supported version gives the same text."""
        text = super().prompt_text(prompt, history)
        processor = self.processor
        wrapper = processor.vision_start_token + processor.video_token + processor.vision_end_token
        if wrapper not in text:
            raise ValueError(f"the chat template did not write the video as {wrapper}")
        return text.replace(wrapper, processor.video_token, 1)

    def video_entries(self, grid: torch.Tensor, metadata: Any) -> dict[str, Any]:
        """The video-side entries `preprocess` returns besides the pixel values: the grid only
        (`Qwen3VLProcessor` has no second_per_grid_ts: its time is the `<t seconds>` text, which
        `replace_video_token` writes from `metadata`)."""
        return {"video_grid_thw": grid}

    def group_times(self, timestamps: Sequence[float]) -> list[float]:
        """Each temporal group's time in seconds as the processor writes it: the mean of its frames'
        timestamps (the last group's missing frame repeats the last timestamp)."""
        times = [float(t) for t in timestamps]
        n = self.frames_per_group
        times += [times[-1]] * (-len(times) % n)
        return [(times[i] + times[i + n - 1]) / 2 for i in range(0, len(times), n)]

    # ----------------------------------------------------------------------------------------
    # vision

    def encode(self, inputs: Any, saliency: bool = True, watch: Any = None):
        """As Qwen2.5-VL; also returns the DeepStack features, (T, N, D) each, in `extra["deepstack"]`,
        and keeps them with `inputs` for `llm_inputs`."""
        visual = super().encode(inputs, saliency=saliency, watch=watch)
        inputs.ottvid_deepstack = visual.extra["deepstack"]
        return visual

    def extra_outputs(self, out: Any, shape: tuple[int, int]) -> dict[str, Any]:
        """The DeepStack features of the (one) video, each reshaped to (T, N, D) like the main tokens."""
        layers = []
        for per_video in out.deepstack_features:
            flat = per_video[0] if len(per_video) == 1 else torch.cat(list(per_video))
            layers.append(flat.reshape(*shape, -1))
        return {"deepstack": tuple(layers)}

    @staticmethod
    def apply_rotary(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

        return apply_rotary_pos_emb_vision(query, key, cos, sin)

    def window_to_raster(self, values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Qwen3-VL's tower has no windows: its merged tokens are already in raster order."""
        return values

    # ----------------------------------------------------------------------------------------
    # language model

    def positions(self, inputs: Any) -> torch.Tensor:
        """M-RoPE positions (3, B, L) of the uncompressed prompt (`positions.qwen3_vl_positions`)."""
        return qwen3_vl_positions(inputs["mm_token_type_ids"], self.merge, video_grid_thw=inputs.get("video_grid_thw"),
                                  image_grid_thw=inputs.get("image_grid_thw"),
                                  attention_mask=inputs.get("attention_mask"))

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   compressed: Compressed | None = None) -> dict[str, Any]:
        """Inputs for generate() with only the kept visual tokens, each at its original position, and
        the DeepStack features compressed with the same decisions.

        features: (M, D) at ascending flat indices `kept` (M,); compressed: the `Compressed` they came
        from. Each DeepStack layer becomes `compressed.apply(layer)`: row m the same combination of
        input rows as the main feature row m (in float32, then the model's dtype; a token kept alone
        keeps its rows bit for bit). Without `compressed`: exact when every token is kept; otherwise
        each output takes its root's own DeepStack rows (a merge is then not followed). Timestamps and
        vision markers are text and all stay, also for a group that lost every token.
        """
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        refuse_order(compressed)
        dtype = self.model.dtype
        merged = getattr(compressed, "extra", {}).get("merged") if compressed is not None else None
        if merged:  # merged while the video was streamed in chunks (compression.stream.OTTVidStream's extra)
            stacked = tuple(layer.to(dtype) for layer in merged)
        else:
            deepstack = getattr(inputs, "ottvid_deepstack", None)
            if deepstack is None:
                raise ValueError("encode(inputs) must run before llm_inputs: Qwen3-VL needs its DeepStack features")
            stacked = tuple(merge_rows(layer.reshape(-1, layer.shape[-1]), kept, compressed).to(dtype)
                            for layer in deepstack)
        encoded = BaseModelOutputWithDeepstackFeatures(pooler_output=(features.to(dtype),),
                                                       deepstack_features=[(layer,) for layer in stacked])
        return {**self.kept_sequence(inputs, kept), "mm_encoder_outputs": {"video": encoded}}

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]:
        """(LLM prefill FLOPs for `llm_tokens` tokens, vision encoder FLOPs for this video).

        MoE: only the routed experts count (num_experts_per_tok of them per token), plus the router.
        """
        grid = [int(v) for v in inputs["video_grid_thw"][0].tolist()]
        config = self.model.config
        return qwen3_llm_prefill_flops(config.text_config, llm_tokens), qwen3_vision_flops(config.vision_config, grid)


def merge_rows(rows: torch.Tensor, kept: torch.Tensor, compressed: Compressed | None) -> torch.Tensor:
    """Rows (T*N, D) of a per-token tensor compressed with the decisions of `compressed`
    (`Compressed.apply`, float32); without it each output takes its root's row (kept (M,))."""
    if compressed is None:
        return rows[kept.to(rows.device)].float()
    if not isinstance(compressed, Compressed):
        raise TypeError(f"compressed must be the Compressed the features came from, got {type(compressed).__name__}")
    return compressed.apply(rows)


def qwen3_llm_prefill_flops(text_config, seq_len: int) -> float:
    """Prefill FLOPs of the Qwen3-VL LLM (flops.llm_prefill_flops's terms); for MoE layers the MLP
    counts only the active experts: per token, num_experts_per_tok gated MLPs of width
    moe_intermediate_size (3 * 2 * h * i each) plus the router (2 * h * num_experts). DeepStack adds
    the visual features to hidden states (element-wise, not counted)."""
    from ..flops import llm_prefill_flops

    experts = int(getattr(text_config, "num_experts", 0) or 0)
    if not experts:
        return llm_prefill_flops(text_config, seq_len)
    h, layers = text_config.hidden_size, text_config.num_hidden_layers
    without_mlp = llm_prefill_flops(SimpleNamespace(**{**text_config.to_dict(), "intermediate_size": 0}), seq_len)
    sparse = [i not in (text_config.mlp_only_layers or []) and (i + 1) % text_config.decoder_sparse_step == 0
              for i in range(layers)]
    moe = text_config.num_experts_per_tok * 3 * 2 * seq_len * h * text_config.moe_intermediate_size \
        + 2 * seq_len * h * experts
    dense = 3 * 2 * seq_len * h * text_config.intermediate_size
    return float(without_mlp + sum(moe if s else dense for s in sparse))


def qwen3_vision_flops(vision_config, grid_thw: Sequence[int]) -> float:
    """FLOPs of Qwen3-VL's vision tower on one video of (t, h, w) patches.

    S = t*h*w patches of width C, MLP width I: patch embedding 2*S*(3*tp*p*p)*C; per block qkv
    2*S*C*3C, output 2*S*C*C, MLP (not gated) 2*2*S*C*I, attention 2*2*C*t*(h*w)^2 (every block
    attends within one temporal group); the merger and each DeepStack merger 2*(S/m^2)*(m^2 C)^2 +
    2*(S/m^2)*(m^2 C)*out. The learned position embedding's interpolation is a weighted gather.
    """
    t, hp, wp = (int(v) for v in grid_thw)
    s = t * hp * wp
    c, inner = vision_config.hidden_size, vision_config.intermediate_size
    unit = vision_config.spatial_merge_size ** 2
    patch = vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size ** 2
    block = 2 * s * c * 3 * c + 2 * s * c * c + 2 * 2 * s * c * inner + 2 * 2 * c * t * (hp * wp) ** 2
    merged = s // unit
    merger = 2 * merged * (unit * c) ** 2 + 2 * merged * unit * c * vision_config.out_hidden_size
    mergers = 1 + len(vision_config.deepstack_visual_indexes)
    return float(2 * s * patch * c + vision_config.depth * block + mergers * merger)
