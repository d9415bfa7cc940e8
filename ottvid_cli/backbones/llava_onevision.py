"""LLaVA-OneVision (and converted LLaVA-Video) with OTT-Vid: saliency from the SigLIP tower's last
layer mapped onto the pooled grid, compression on the pooled tokens, the newline token kept.

transformers' `LlavaOnevisionForConditionalGeneration.get_video_features` runs SigLIP, the
projector and 2x2 bilinear pooling (27x27 -> 14x14 = 196 tokens a frame), then appends one
learned newline token after the whole video. Positions are plain 1-D and contiguous: dropping
tokens from the sequence is all that compression needs.

With a SigLIP attention-pooling head (`load(..., siglip_head=...)`, docs/llava.md), `encode` also
returns FastVID's signals: each frame's pooled global feature and the head's attention on the grid.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..timing import Stopwatch
from .base import (KeptTokenGeneration, ModelError, VisualTokens, attention_implementation, chat_text,
                   load_processor, resolve_device, resolve_dtype)
from ..video.resize import FrameResize
from .attention import recording, records_saliency, use_recording_vision
from .saliency import mean_attention_received


class LlavaOneVision(KeptTokenGeneration):
    """Adapter for LlavaOnevisionForConditionalGeneration and its processor."""

    frames_per_group = 1
    default_frames = 32
    grounds = False  # the paper evaluates grounding on Qwen2.5-VL only
    lmms_sampling = "linspace-floor"  # lmms-eval's llava_onevision / llava_vid: np.linspace(..., dtype=int)
    # `--preset official`: the authors' LLaVA path rounds K (llava_vid.py `_run_spatial_llava`)
    official_overrides = {"k_rounding": "round"}
    # the peer methods' official LLaVA-OneVision paths (docs/methods.md, "Per-backbone paths and signals"):
    # FastVID's fastvid_llavaonevision (its scripts/eval.sh: DySeg_tau 0.9)
    onevision_method_defaults = {"fastvid": {"path": "llava_onevision", "tau": 0.9},
                                 # FlashVID's LLaVA-OneVision run (scripts/llava_ov.sh); its Qwen2.5-VL run
                                 # cuts 4, ADTS v1
                                 "flashvid": {"min_segments": 8, "selection": "attn_div_v2"}}
    # their LLaVA-Video paths, for a converted LLaVA-Video checkpoint (`__init__` picks): FastVID's
    # fastvid_llavavideo (its scripts/eval.sh: DySeg_c 8, DySeg_tau 0.9, STPrune_d 0.4, DTM_p 4, DTM_beta 0.6;
    # the others are the registry's defaults already); FlashVID's LLaVA-Video run (scripts/llava_vid.sh)
    video_method_defaults = {"fastvid": {"path": "llava_video", "tau": 0.9},
                             "flashvid": {"min_segments": 8, "selection": "attn_div_v2"}}
    # VisionZip's video variant (HoliTom visionzip/llava_arch.py) lays its tokens out by the newline rule:
    # one_token feeds each frame's dominant then contextual tokens (l.180, l.230-237), grid re-sorts by position
    visionzip_by_newline = {"one_token": {"layout": "official"}, "grid": {"grid_newline": True}}

    def __init__(self, model, processor, name: str, settings: dict | None = None, siglip_head: Any = None,
                 siglip_head_name: str | None = None):
        """settings: a converted LLaVA-Video checkpoint's own pooling and newline rules (ottvid.json);
        None for a transformers LLaVA-OneVision checkpoint (bilinear 2x, one newline per video).
        siglip_head: SigLIP's `post_layernorm` and attention-pooling `head` (a ModuleDict, from
        `load_siglip_head`), or None; with it `encode` also returns the signals FastVID reads."""
        self.model = model
        self.siglip_head = siglip_head
        self.siglip_head_name = siglip_head_name
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
        # the peer methods' official paths for this checkpoint (`method_defaults`, docs/methods.md):
        # LLaVA-OneVision's, or LLaVA-Video's when converted, and VisionZip's layout for its newline rule
        chosen = self.onevision_method_defaults if settings is None else self.video_method_defaults
        self.method_defaults = {method: dict(options) for method, options in chosen.items()}
        if self.newline_position in self.visionzip_by_newline:
            self.method_defaults["visionzip"] = dict(self.visionzip_by_newline[self.newline_position])
        if self.pool_mode == "bilinear":
            pooled = math.ceil(side / self.pool_stride)
        else:
            pooled = (side - self.pool_stride) // self.pool_stride + 1
        self.grid = (pooled, pooled)

    @classmethod
    def load(cls, model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
             max_pixels: int | None = None, siglip_head: str | None = None) -> "LlavaOneVision":
        """siglip_head: a SigLIP vision checkpoint that has its attention-pooling head (a hub id or a
        folder, e.g. google/siglip-so400m-patch14-384, the tower LLaVA-OneVision was trained from):
        its post_layernorm and head are kept (`load_siglip_head`); None: no head, no signals."""
        from transformers import AutoConfig, LlavaOnevisionForConditionalGeneration

        dev = resolve_device(device)
        processor = load_processor(model_id, AutoConfig.from_pretrained(model_id).video_token_index)  # before the weights
        model = LlavaOnevisionForConditionalGeneration.from_pretrained(
            model_id, dtype=resolve_dtype(dtype, dev), attn_implementation=attention_implementation(attention),
            use_kernels=False,  # transformers 5.25 on: no Hub kernels swapped in (docs/attention.md)
        ).to(dev).eval()
        if attention == "auto":  # sdpa, whose last layer also gives the saliency (`encode`)
            use_recording_vision(model)
        settings_file = os.path.join(model_id, "ottvid.json")
        settings = json.loads(open(settings_file).read()) if os.path.isfile(settings_file) else None
        head = None
        if siglip_head is not None:
            head = cls.load_siglip_head(siglip_head, model.config.vision_config.hidden_size, dev, model.dtype)
        return cls(model, processor, name=model_id, settings=settings,
                   siglip_head=head, siglip_head_name=siglip_head)

    @staticmethod
    def load_siglip_head(source: str, width: int, device: torch.device, dtype: torch.dtype) -> torch.nn.ModuleDict:
        """SigLIP's post_layernorm and attention-pooling head from a vision checkpoint that has them
        (transformers' SiglipVisionModel; its embeddings and encoder are dropped, as FastVID's
        SigLipVisionAbstract.load_model does). ModelError when it cannot be read, has no head
        (vision_use_head=False, as in LLaVA-OneVision checkpoints) or is not `width` wide."""
        from transformers import SiglipVisionModel

        try:
            vision = SiglipVisionModel.from_pretrained(source, dtype=dtype, use_kernels=False)
        except (OSError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"cannot load the SigLIP head {source}: {reason[:200]}") from None
        if not getattr(vision.config, "vision_use_head", False) or getattr(vision, "head", None) is None:
            raise ModelError(f"{source} has no SigLIP attention-pooling head (vision_use_head=False): use the "
                             f"original SigLIP checkpoint, e.g. google/siglip-so400m-patch14-384")
        if vision.config.hidden_size != width:
            raise ModelError(f"the SigLIP head {source} is {vision.config.hidden_size} wide, the model's vision "
                             f"tower {width}: they do not belong together")
        head = torch.nn.ModuleDict({"post_layernorm": vision.post_layernorm, "head": vision.head})
        del vision
        return head.to(device).eval().requires_grad_(False)

    def frame_resize(self, max_pixels: int | None = None, min_pixels: int | None = None) -> FrameResize | None:
        """How frames leave the decoder for this model: the processor's own fixed size (384 x 384) by the
        processor's own resize (on a contiguous uint8 batch, as the processor lays frames out), which then
        leaves them as they are; None for a processor without a fixed height and width (frames as decoded).
        The pixel range is Qwen's and does not apply."""
        vp = self.processor.video_processor
        size = dict(vp.size or {})
        if not (vp.do_resize and size.get("height") and size.get("width")):
            return None

        def resample(batch, target):
            from transformers.image_utils import SizeDict

            return vp.resize(batch, size=SizeDict(height=int(target[0]), width=int(target[1])), resample=vp.resample)

        return FrameResize(target=(int(size["height"]), int(size["width"])), resample=resample, contiguous=True)

    def preprocess(self, frames: np.ndarray, timestamps: list[float], duration: float, prompt: str,
                   history: Sequence[tuple[str, str]] = (), source_size: tuple[int, int] | None = None) -> Any:
        """Frames (n, H, W, 3) uint8 and a prompt -> model inputs (the processor resizes to 384 x 384, which
        leaves frames the decoder already resized (`frame_resize`) as they are; `source_size` is not needed)."""
        text = chat_text(self.processor, prompt, history)
        inputs = self.processor(text=[text], videos=[np.ascontiguousarray(frames)], return_tensors="pt")
        self._fit_video_tokens(inputs, self.layout(len(frames)).numel())
        inputs = inputs.to(self.device)
        inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(self.model.dtype)
        return inputs

    def prompt_inputs(self, frames: int, frame_size: tuple[int, int], timestamps: list[float], duration: float,
                      prompt: str, history: Sequence[tuple[str, str]] = ()) -> Any:
        """The processor's text-side inputs for a video of `frames` frames, built without any pixels:
        input_ids and attention_mask, equal to `preprocess(...)`'s (which returns nothing else but the
        pixel values), on the device. `frame_size`, `timestamps` and `duration` do not change them (the
        processor resizes every frame to its fixed size and writes no time); they are taken for the
        common signature (`Qwen25VL.prompt_inputs`).

        `LlavaOnevisionProcessor.replace_video_token` reads only the frame count of the processed video
        (`pixel_values_videos[0].shape[0]`): it is handed an empty (frames, 0) stand-in, then
        `qwen2_5_vl.processor_text_inputs` runs the rest of `ProcessorMixin.__call__`'s text path, and
        the run of video tokens is fit to this checkpoint's layout as `preprocess` fits it. transformers
        methods relied on (5.24): those of `processor_text_inputs` and `replace_video_token`."""
        from .qwen2_5_vl import processor_text_inputs

        stand_in = {"pixel_values_videos": [torch.empty((int(frames), 0))]}
        inputs = processor_text_inputs(self.processor, chat_text(self.processor, prompt, history), stand_in, {})
        self._fit_video_tokens(inputs, self.layout(int(frames)).numel())
        inputs = inputs.to(self.device)
        inputs.ottvid_frames = int(frames)  # what `frame_count` reads where there are no pixel values
        return inputs

    def grid_of(self, inputs: Any) -> tuple[int, int]:
        """(H, W) pooled tokens of every frame (the same for every video)."""
        return self.grid

    @staticmethod
    def frame_count(inputs: Any) -> int:
        """Frames of the video in `inputs`: its pixel values', or those `prompt_inputs` was built for."""
        if "pixel_values_videos" in inputs:
            return int(inputs["pixel_values_videos"].shape[1])
        return int(inputs.ottvid_frames)

    def pixel_inputs(self, frames: np.ndarray, source_size: tuple[int, int] | None = None) -> Any:
        """One chunk of frames (n, H, W, 3) uint8 -> pixel_values_videos (1, n, 3, h, w) of these frames
        only, in the model's dtype on the device: `encode`'s input for them, equal to the frames' rows
        of the whole video's `preprocess(...)["pixel_values_videos"]` (the video processor -- the same
        call as `preprocess` makes through the processor -- resizes and normalises every frame on its
        own). `source_size` is not needed (see `preprocess`).

        `encode(pixel_inputs(chunk))` encodes the chunk's frames alone; its outputs concatenated along T
        over the chunks are the one-shot `encode(preprocess(...))`'s: the features and saliency bit for
        bit on the CPU (SigLIP, the projector, the pooling and the saliency act on each frame's 729
        patches; every matmul has frames x 729 rows, and its per-row arithmetic does not depend on how
        many). The SigLIP head's signals (`_head_signals`) are not bit-identical: the head's matmuls
        over one row per frame (the probe's query projection, the pooling attention's output projection
        and the head's MLP) take another kernel or summation order for another row count on the CPU
        (measured on the tiny models of tests/test_chunked_encode.py, chunks of 1 to 3 frames: max abs
        difference 8.4e-7 in "frame_features" (values up to 3, a few float32 ulps) and 3.5e-10 in
        "attention" (values up to 1.5e-3, relative 2.6e-7)). Not measured on a GPU, where cuBLAS may
        also choose other kernels for the tower's matmuls with another frame count."""
        inputs = self.processor.video_processor(videos=[np.ascontiguousarray(frames)], return_tensors="pt")
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
        stack = contextlib.ExitStack()
        if saliency:
            attn = self.last_vision_attention()
            if records_saliency(attn):  # the layer's attention gives "received" as it runs
                capture = stack.enter_context(recording(attn))
            else:  # transformers' own kernels: q and k kept for `_saliency` to recompute it
                handles = [attn.q_proj.register_forward_hook(lambda m, a, out: capture.__setitem__("q", out)),
                           attn.k_proj.register_forward_hook(lambda m, a, out: capture.__setitem__("k", out))]
            if self.siglip_head is not None:  # the tower's selected hidden state, as the projector receives it
                projector = self.model.model.multi_modal_projector
                handles.append(projector.register_forward_pre_hook(
                    lambda m, args: capture.__setitem__("hidden", args[0])))
        frames = inputs["pixel_values_videos"].shape[1]
        try:
            with stack, watch("vision"):
                tokens = self._features(inputs["pixel_values_videos"])
        finally:
            stack.close()
            for handle in handles:
                handle.remove()
        sal = None
        signals: dict[str, Any] = {}
        if saliency:
            with watch("saliency"):
                sal = self._saliency(capture, frames)
                if self.siglip_head is not None:
                    signals = self._head_signals(capture["hidden"], frames)
        return VisualTokens(features=tokens, saliency=sal, grid=self.grid, signals=signals)

    def _head_signals(self, hidden: torch.Tensor, frames: int) -> dict[str, Any]:
        """FastVID's signals from the SigLIP head (fastvid_llavaonevision llava_arch.py `encode_images`,
        siglip_encoder.py `SigLipVisionAbstract.forward`): post_layernorm on the tower's hidden state
        (T, 729, C), then the head: "frame_features" (T, C) its pooled output, "attention" (T, N) its
        probe's attention averaged over heads, pooled onto the grid like the features (`get_attn_2dPool`:
        27x27 bilinearly to 14x14 on LLaVA-OneVision, fastvid_llavaonevision llava_arch.py lines 188-199,
        2x2 average pooling to 13x13 on a converted LLaVA-Video, fastvid_llavavideo llava_arch.py lines
        188-197, `avg_pool2d(frame_attn_weights, stride)`; both as `_pool` pools the features)."""
        head = self.siglip_head
        states = head["post_layernorm"](hidden.to(head["post_layernorm"].weight.dtype))
        pooled, attention = siglip_pool(head["head"], states)
        rows, cols = self.patch_grid
        if attention.shape[-1] != rows * cols:
            raise ValueError(f"the SigLIP head saw {attention.shape[-1]} tokens a frame, not the {rows}x{cols} patches")
        maps = attention.float().reshape(frames, 1, rows, cols)
        return {"frame_features": pooled.float(), "attention": self._pool(maps).reshape(frames, -1),
                "source": "siglip_head"}

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
        frame), pooled onto the 14 x 14 grid with the model's own bilinear pooling. As the layer computed
        it with its output ("received", `attention.recording`), else recomputed from its q and k in
        query chunks."""
        received = capture.get("received")
        if received is None:
            attn = self.last_vision_attention()
            q, k = capture["q"], capture["k"]  # (T, S, C)
            t, s, _ = q.shape
            heads = attn.num_heads
            query = q.reshape(t * s, heads, -1)
            key = k.reshape(t * s, heads, -1)
            received = mean_attention_received(query, key, [i * s for i in range(t + 1)], attn.scale)
        maps = received.reshape(frames, 1, *self.patch_grid)
        return self._pool(maps).reshape(frames, -1).clamp_min(0.0)  # pooled like the features

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   compressed: Any = None) -> dict[str, Any]:
        """Inputs for generate() with only the kept visual tokens, each in its own slot of the model's
        layout, and every newline token where the model puts it. Positions stay 1-D and contiguous.

        With `compressed.order` (VisionZip's official layout) the kept visual slots, which the layout
        puts in ascending position, are filled with the rows in that order instead: the i-th kept
        slot gets row order[i]. The newline tokens stay where the layout puts them; the positions
        are the sequence's, renumbered 0..L'-1 as always."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        order = getattr(compressed, "order", None)
        if order is not None:
            if order.shape != (features.shape[0],):
                raise ValueError(f"compressed.order must be a permutation of the {features.shape[0]} rows, "
                                 f"got shape {tuple(order.shape)}")
            features = features[order.to(features.device)]
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        frames = self.frame_count(inputs)
        layout = self.layout(frames).to(ids.device)
        slot_kept = (layout < 0) | torch.isin(layout, kept.to(ids.device))
        video = ids == self.video_token_id
        keep = ~video
        for b in range(ids.shape[0]):
            keep[b, video[b].nonzero().flatten()[slot_kept]] = True
        placed_layout = layout[slot_kept]
        newline = self.model.model.image_newline.to(features.device, self.model.dtype)
        placed = newline.expand(placed_layout.numel(), -1).clone()
        placed[placed_layout >= 0] = features.to(self.model.dtype)  # in `order`, else kept ascending = layout order
        batch = ids.shape[0]
        return {"input_ids": ids[keep].view(batch, -1), "attention_mask": mask[keep].view(batch, -1),
                "mm_encoder_outputs": {"video": BaseModelOutputWithPooling(pooler_output=placed[None])}}

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]:
        from ..flops import llm_prefill_flops, siglip_video_flops

        frames = self.frame_count(inputs)
        config = self.model.config
        return (llm_prefill_flops(config.text_config, llm_tokens),
                siglip_video_flops(config.vision_config, frames, config.text_config.hidden_size))


def siglip_pool(head: torch.nn.Module, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' SiglipMultiheadAttentionPoolingHead.forward on (B, S, C), keeping the attention
    weights it drops: (pooled (B, C), the probe's attention to each token averaged over heads (B, S))."""
    probe = head.probe.expand(states.shape[0], -1, -1)
    out, weights = head.attention(probe, states, states, need_weights=True, average_attn_weights=True)
    out = out + head.mlp(head.layernorm(out))
    return out[:, 0], weights[:, 0]
