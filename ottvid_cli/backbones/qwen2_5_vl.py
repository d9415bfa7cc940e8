"""Qwen2.5-VL with OTT-Vid: saliency from the last vision block, compression between the vision
encoder and the LLM, every kept token at its original 3-D M-RoPE position.

Only transformers' own classes are used; the hooks are public ones: the vision tower's attention
registered through `AttentionInterface` (`attention.py`: one call per block, whose last block also
records the attention its tokens receive), or, with another attention implementation, a forward
pre-hook on the last vision block's attention (its segment boundaries and rotary embeddings) and a
hook on its qkv layer; `get_video_features` and `generate(position_ids=..., mm_encoder_outputs=...)`. Positions are
computed here by the rule the checkpoints were trained with (`positions.py`), never read from the
installed transformers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import numpy as np
import torch

from ..timing import Stopwatch
from ..video.resize import FrameResize, bicubic
from . import fast_vision
from .attention import recording, records_saliency, use_packed_vision
from .base import (KeptTokenGeneration, VisualTokens, attention_implementation, chat_text, check_aspect,
                   load_processor, resolve_device, resolve_dtype)
from .positions import qwen2_5_vl_positions
from .saliency import mean_attention_received

# The paper's setting: 448 x 448 pixels a frame, i.e. 16 x 16 = 256 tokens per temporal group.
DEFAULT_MAX_PIXELS = 448 * 448


def refuse_order(compressed: Any) -> None:
    """ValueError for a `Compressed` with an `order` (VisionZip's LLaVA-OneVision layout): on M-RoPE
    models every row sits at its root's position, and the sequence follows ascending positions."""
    if getattr(compressed, "order", None) is not None:
        raise ValueError("Compressed.order (a LLaVA-OneVision token layout, e.g. visionzip layout='official') is "
                         "not supported on M-RoPE models, whose tokens keep their positions: use the default layout")


def processor_text_inputs(processor: Any, text: str, video_inputs: dict[str, Any], entries: dict[str, Any]) -> Any:
    """`ProcessorMixin.__call__`'s text path (transformers 5.18 to 5.25) for a chat text holding one video
    placeholder, without the video's pixels: `video_inputs` holds what the processor's own
    `replace_video_token` reads of the processed video (its grid and metadata, or a stand-in for its
    frames), `entries` the video-side entries the call returns besides the pixel values. As the call
    does: `prepare_inputs_layout`, the kwargs of `_merge_kwargs` (return_tensors "pt"), the placeholder
    expanded by `replace_video_token` and `get_text_with_replacements`, the tokenizer with the text
    kwargs, `_check_special_mm_tokens`, mm_token_type_ids by `create_mm_token_type_ids` where the
    processor returns them, the processor's `unused_input_names` left out, then one `BatchFeature` of
    the text's and `entries`' tensors."""
    from transformers.feature_extraction_utils import BatchFeature

    _, texts, _, _ = processor.prepare_inputs_layout(text=[text])
    tokenizer = processor.tokenizer
    # the processor's kwargs class passed as 5.18-5.23 require it (5.24 defaults to the same)
    merged = processor._merge_kwargs(processor.valid_processor_kwargs, tokenizer_init_kwargs=tokenizer.init_kwargs,
                                     return_tensors="pt")
    replacement = processor.replace_video_token(video_inputs, video_idx=0, **merged["videos_kwargs"])
    texts, _ = processor.get_text_with_replacements(texts, videos_replacements=[replacement])
    text_kwargs = merged["text_kwargs"]
    types = text_kwargs.pop("return_mm_token_type_ids", merged.get("return_mm_token_type_ids", False))
    text_kwargs.pop("return_text_replacement_offsets", None)
    encoded = tokenizer(texts, **text_kwargs)
    processor._check_special_mm_tokens(texts, encoded, modalities=["image", "video", "audio"])
    data = dict(encoded)
    if types:
        data["mm_token_type_ids"] = processor.create_mm_token_type_ids(data["input_ids"])
    data = {k: v for k, v in {**data, **entries}.items() if k not in processor.unused_input_names}
    return BatchFeature(data, tensor_type="pt")


class Qwen25VL(KeptTokenGeneration):
    """Adapter for Qwen2_5_VLForConditionalGeneration and its processor."""

    frames_per_group = 2  # temporal_patch_size
    default_frames = 32
    grounds = True
    default_max_pixels = DEFAULT_MAX_PIXELS
    official_overrides: dict = {}  # `--preset official`: the authors' Qwen2.5-VL path is official()'s default
    method_defaults: dict = {}  # the peer methods' defaults are their Qwen2.5-VL paths already
    lmms_sampling = "linspace"  # lmms-eval's Qwen2.5-VL / Qwen3-VL read frames with qwen-vl-utils
    # the pixel range lmms-eval's Qwen2.5-VL gives qwen-vl-utils (its min_pixels / max_pixels defaults;
    # qwen-vl-utils then caps a frame at 768 merged tokens and the video's total budget)
    lmms_pixels = {"min_pixels": 256 * 28 * 28, "max_pixels": 1605632}
    min_pixels: int | None = None  # per frame at least (None: the processor's own minimum)

    def __init__(self, model, processor, name: str, max_pixels: int = DEFAULT_MAX_PIXELS):
        self.model = model
        self.processor = processor
        self.name = name
        self.max_pixels = max_pixels
        self.device = next(model.parameters()).device
        self.video_token_id = model.config.video_token_id
        vision = model.config.vision_config
        self.merge = vision.spatial_merge_size
        self.frames_per_group = vision.temporal_patch_size
        self.patch = vision.patch_size

    @classmethod
    def load(cls, model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
             max_pixels: int | None = None) -> "Qwen25VL":
        from transformers import AutoConfig

        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        processor = load_processor(model_id, AutoConfig.from_pretrained(model_id).video_token_id)  # before the weights
        model = cls.model_class(model_id).from_pretrained(
            model_id, dtype=torch_dtype, attn_implementation=attention_implementation(attention),
            use_kernels=False,  # transformers 5.25 on: no Hub kernels swapped in (docs/attention.md)
        ).to(dev).eval()
        if attention == "auto":  # the vision tower's windows / frame groups in one call per block
            use_packed_vision(model)
            if fast_vision.enabled(dev):  # fewer, better-shaped kernels (docs/gpu.md)
                fast_vision.speed_up_vision(model)
        return cls(model, processor, name=model_id, max_pixels=max_pixels or cls.default_max_pixels)

    @classmethod
    def model_class(cls, model_id: str):
        """The transformers class that loads this checkpoint."""
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration

    def newline_tokens(self, groups: int) -> int:
        """Qwen2.5-VL puts no separator tokens among the visual tokens."""
        return 0

    def prompt_text(self, prompt: str, history: Sequence[tuple[str, str]] = ()) -> str:
        """The chat text the processor expands (`base.chat_text`): Qwen2.5-VL's video stays
        `<|vision_start|><|video_pad|><|vision_end|>`, the pad expanded to the video's tokens."""
        return chat_text(self.processor, prompt, history)

    # ----------------------------------------------------------------------------------------
    # preprocessing

    def frame_size(self, height: int, width: int, frames: int, max_pixels: int | None = None,
                   min_pixels: int | None = None) -> tuple[int, int]:
        """Target (height, width) of every frame: qwen-vl-utils' smart_resize, within the processor's
        pixel range (its minimum raised to `min_pixels` when set), at most `max_pixels`, and within the
        video's total pixel budget. A side is at least one `factor` (28): qwen-vl-utils 0.0.14 floors
        the short side of a very narrow frame to 0 when it shrinks it (16x3000: (1512, 0), which the
        resize then refused with a RuntimeError), where transformers' own smart_resize keeps
        max(factor, ...); every other size is qwen-vl-utils' exactly."""
        from qwen_vl_utils import smart_resize

        check_aspect(height, width, "Qwen2.5-VL")
        size = self.processor.video_processor.size
        factor = self.patch * self.merge
        min_pixels = int(min_pixels or self.min_pixels or size["shortest_edge"])
        max_pixels = min(int(size["longest_edge"]), int(max_pixels or self.max_pixels))
        budget = int(self.processor.video_processor.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, budget * self.frames_per_group // max(frames, 1)), int(min_pixels * 1.05))
        resized = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        return max(factor, resized[0]), max(factor, resized[1])

    def frame_resize(self, max_pixels: int | None = None, min_pixels: int | None = None) -> FrameResize:
        """How frames leave the decoder for this model: `frame_size` (for the sample's frame count made a
        multiple of the temporal patch, as `preprocess` pads it) and `preprocess`'s own resampling, so that
        `pixel_values` are the same whether frames are resized as decoded or here."""
        step = self.frames_per_group
        # the range as it is now: `prepared.pixel_range` sets the backbone's own for a preprocess meanwhile
        max_pixels, min_pixels = max_pixels or self.max_pixels, min_pixels or self.min_pixels

        def target(height: int, width: int, frames: int) -> tuple[int, int]:
            return self.frame_size(height, width, -(-frames // step) * step, max_pixels, min_pixels)

        return FrameResize(target=target, resample=bicubic)

    def preprocess(self, frames: np.ndarray, timestamps: list[float], duration: float, prompt: str,
                   history: Sequence[tuple[str, str]] = (), source_size: tuple[int, int] | None = None) -> Any:
        """Frames (n, H, W, 3) uint8 and a text prompt -> the processor's model inputs on the device.

        Frames are resized as qwen-vl-utils' fetch_video does (bicubic, antialiased: `video.resize.bicubic`)
        unless they are at their size already: `source_size` is the (height, width) they were decoded at
        when the decoder resized them (`frame_resize`), whose target they then have. The real sampling rate
        is passed as video metadata so that second_per_grid_ts, hence the model's absolute time
        positions, are right.
        """
        video = self.video_frames(frames, source_size)
        metadata = self.video_metadata(timestamps, duration, video.shape[0])
        text = self.prompt_text(prompt, history)
        inputs = self.processor(text=[text], videos=[video], video_metadata=[metadata], do_sample_frames=False,
                                do_resize=False, cap_pixels_per_frame=True, return_tensors="pt")
        return inputs.to(self.device)

    def video_frames(self, frames: np.ndarray, source_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The frames (n, H, W, 3) uint8 as the processor is handed them: (n', 3, h, w), the last frame
        repeated up to a multiple of the temporal patch, resized to `frame_size` unless the decoder did
        (`source_size`, see `preprocess`). What another engine is given too (`ottvid eval --engine vllm`)."""
        video = self.padded_frames(frames)
        size = (video.shape[2], video.shape[3])
        if source_size is None or self.frame_size(*source_size, video.shape[0]) != size:
            video = bicubic(video, self.frame_size(video.shape[2], video.shape[3], video.shape[0]))
        return video

    def padded_frames(self, frames: np.ndarray) -> torch.Tensor:
        """Frames (n, H, W, 3) uint8 -> (n', 3, H, W), the last frame repeated up to a multiple of the
        temporal patch (as `preprocess` pads)."""
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # (n, 3, H, W)
        n = video.shape[0]
        if n % self.frames_per_group:
            video = torch.cat([video, video[-1:].expand(self.frames_per_group - n % self.frames_per_group, -1, -1, -1)])
        return video

    def video_metadata(self, timestamps: list[float], duration: float, frames: int) -> dict[str, Any]:
        """The metadata the processor reads: the average sampling rate (for second_per_grid_ts)."""
        fps = len(timestamps) / duration if duration > 0 else 1.0
        return {"fps": fps, "frames_indices": list(range(frames)), "total_num_frames": frames, "duration": duration}

    # ----------------------------------------------------------------------------------------
    # preprocessing chunk by chunk (long videos): the text side without pixels, the pixels per chunk

    def prompt_inputs(self, frames: int, frame_size: tuple[int, int], timestamps: list[float], duration: float,
                      prompt: str, history: Sequence[tuple[str, str]] = ()) -> Any:
        """The processor's text-side inputs for a video of `frames` frames of `frame_size` (h, w) pixels as
        the processor is handed them (after the model's resize: `frame_size()` of the source size for the
        frame count made a multiple of the temporal patch), built without any pixels: input_ids,
        attention_mask, mm_token_type_ids, video_grid_thw (the whole video) and, Qwen2.5-VL,
        second_per_grid_ts -- `preprocess(...)`'s entries but pixel_values_videos, equal to them, on the
        device.

        The grid is T = ceil(frames / frames_per_group) groups of (h / patch, w / patch) patches. The
        placeholder is expanded by the processor's own `replace_video_token` (Qwen3-VL's: the
        `<t seconds>` and vision markers of each group, from the same `video_metadata` as `preprocess`
        passes), then `processor_text_inputs` runs the rest of `ProcessorMixin.__call__`'s text path.
        second_per_grid_ts is `Qwen2_5_VLProcessor._process_videos`'s temporal_patch_size /
        `VideoMetadata.sampled_fps` (that method runs the video processor on the pixels, so it is not
        called). transformers methods relied on (5.24): `VideoMetadata`, `ProcessorMixin.prepare_inputs_layout`,
        `_merge_kwargs`, `replace_video_token`, `get_text_with_replacements`, `_check_special_mm_tokens`,
        `create_mm_token_type_ids`, the tokenizer's `__call__` and `BatchFeature`."""
        from transformers.video_utils import VideoMetadata

        groups = -(-int(frames) // self.frames_per_group)
        metadata = VideoMetadata(**self.video_metadata(timestamps, duration, groups * self.frames_per_group))
        grid = torch.tensor([[groups, *self.patch_grid(frame_size)]])
        entries = self.video_entries(grid, metadata)
        text = self.prompt_text(prompt, history)
        inputs = processor_text_inputs(self.processor, text, {**entries, "video_metadata": [metadata]}, entries)
        return inputs.to(self.device)

    def patch_grid(self, frame_size: tuple[int, int]) -> tuple[int, int]:
        """(h, w) pixels -> the processor's grid of patches (h / patch, w / patch); ValueError for a size
        that is not a multiple of patch x merge (not a size `frame_size()` gives)."""
        factor = self.patch * self.merge
        h, w = (int(v) for v in frame_size)
        if h <= 0 or w <= 0 or h % factor or w % factor:
            raise ValueError(f"frame size {h} x {w} is not a multiple of {factor} pixels: pass the backbone's "
                             f"frame_size() of the source size")
        return h // self.patch, w // self.patch

    def video_entries(self, grid: torch.Tensor, metadata: Any) -> dict[str, Any]:
        """The video-side entries `preprocess` returns besides the pixel values: the grid and
        `Qwen2_5_VLProcessor._process_videos`'s second_per_grid_ts (temporal patch / sampled fps)."""
        return {"video_grid_thw": grid,
                "second_per_grid_ts": [self.processor.video_processor.temporal_patch_size / metadata.sampled_fps]}

    def grid_of(self, inputs: Any) -> tuple[int, int]:
        """(H, W) merged tokens of each temporal group of the video in `inputs` (its video_grid_thw)."""
        _, height, width = (int(v) for v in inputs["video_grid_thw"][0].tolist())
        return height // self.merge, width // self.merge

    def pixel_inputs(self, frames: np.ndarray, source_size: tuple[int, int] | None = None,
                     frame_size: tuple[int, int] | None = None) -> Any:
        """One chunk of frames (n, H, W, 3) uint8 -> pixel_values_videos and video_grid_thw of this chunk
        only, on the device: `encode`'s input for these frames, whose rows are those of the whole video's
        `preprocess(...)["pixel_values_videos"]` that belong to them (each temporal group's rows are
        contiguous, t * h * w / patch^2 of them before group t). n is a multiple of `frames_per_group`
        but in the last chunk, whose last frame is repeated as `preprocess` pads.

        The frames are resized (as `preprocess` resizes, frame by frame, so per chunk alike) to the
        whole video's `frame_size` (h, w) when given -- the size `prompt_inputs` was given; else, with
        `source_size` (the decoder resized them with `frame_resize()` for the whole video), they are
        taken at their own size; else these frames are taken for the whole video (`frame_size()` of
        their count: the budget of a longer video may give another size). Then the video processor
        (`processor.video_processor`, the same options as `preprocess`: no sampling, no resize) makes
        the patches.

        `encode(pixel_inputs(chunk))` runs the vision tower on the chunk's groups alone (its grid has
        the chunk's T). Every block attends within a window of one group or within one whole group, the
        rotary / learned position embeddings and the merge depend on (h, w) only, and the saliency is
        computed per group (`cu_seqlens`), so the chunks' features, saliency and Qwen3-VL's DeepStack
        features, concatenated along T, are the one-shot encode's bit for bit on the CPU (measured on
        the tiny models of tests/test_chunked_encode.py and on 1280- and 1152-wide towers at 448 x 448:
        max abs difference 0). Not measured on a GPU, where cuBLAS / SDPA may choose other kernels for
        another number of rows or segments: expect float rounding differences there."""
        video = self.padded_frames(frames)
        size = (int(video.shape[2]), int(video.shape[3]))
        if frame_size is not None:
            target = (int(frame_size[0]), int(frame_size[1]))
        elif source_size is not None:
            target = size
        else:
            target = self.frame_size(*size, video.shape[0])
        if target != size:
            video = bicubic(video, target)
        inputs = self.processor.video_processor(videos=[video], do_sample_frames=False, do_resize=False,
                                                cap_pixels_per_frame=True, return_tensors="pt")
        return inputs.to(self.device)

    # ----------------------------------------------------------------------------------------
    # vision

    @torch.inference_mode()
    def encode(self, inputs: Any, saliency: bool = True, watch: Stopwatch | None = None) -> VisualTokens:
        """Run the vision encoder (and merger); returns (T, N, D) tokens, (T, N) saliency, (H, W) grid.

        With a stopwatch, the encoder's and the saliency's times are recorded as "vision" and "saliency".
        With the packed vision attention the last block computes the attention its tokens receive as it
        runs (`capture_saliency`), inside "vision"; "saliency" then merges and reorders it.
        """
        watch = watch or Stopwatch(self.device)
        grid_thw = inputs["video_grid_thw"]
        capture: dict[str, Any] = {}
        with contextlib.ExitStack() as stack:
            if saliency:
                capture = self.capture_saliency(stack)
            with watch("vision"):
                out = self.model.model.get_video_features(
                    pixel_values_videos=inputs["pixel_values_videos"], video_grid_thw=grid_thw
                )
        features = out.pooler_output
        if isinstance(features, (tuple, list)):
            features = features[0] if len(features) == 1 else torch.cat(list(features))
        t, h, w = (int(v) for v in grid_thw[0].tolist())
        grid = (h // self.merge, w // self.merge)
        tokens = features.reshape(t, grid[0] * grid[1], -1)
        sal = None
        if saliency:
            with watch("saliency"):
                sal = self._saliency(capture, grid_thw).reshape(t, -1)
        return VisualTokens(features=tokens, saliency=sal, grid=grid, extra=self.extra_outputs(out, tokens.shape[:2]))

    def extra_outputs(self, out: Any, shape: tuple[int, int]) -> dict[str, Any]:
        """Encoder outputs besides the main tokens that the LLM needs (none for Qwen2.5-VL)."""
        return {}

    def capture_saliency(self, stack: contextlib.ExitStack) -> dict[str, Any]:
        """Make the last vision block give what `_saliency` reads during the next forward; `stack` undoes
        it. With the packed attention (`attention.records_saliency`) the block computes, as it attends,
        the attention each token receives (`attention.recording`: post-rotary q and k, one pass over the
        scores). Any other attention implementation runs transformers' own kernels, so hooks keep the
        block's qkv output, rotary cos / sin and segments for `_saliency` to recompute it."""
        attn = self.model.model.visual.blocks[-1].attn
        if records_saliency(attn):
            return stack.enter_context(recording(attn))
        capture: dict[str, Any] = {}

        def grab(module, args, kwargs):
            capture["cu_seqlens"] = kwargs["cu_seqlens"]
            capture["rotary"] = kwargs["position_embeddings"]

        def grab_qkv(module, args, output):
            capture["qkv"] = output

        stack.callback(attn.register_forward_pre_hook(grab, with_kwargs=True).remove)
        stack.callback(attn.qkv.register_forward_hook(grab_qkv).remove)
        return capture

    def _saliency(self, capture: dict[str, Any], grid_thw: torch.Tensor) -> torch.Tensor:
        """Mean attention each merged token receives in the last vision block, in raster order.

        The attention each patch receives within its segment of that block (a temporal group for a
        full-attention block), mean over heads and queries: as the block computed it ("received",
        `capture_saliency`), else recomputed from its qkv output (attention weights are not returned by
        sdpa or flash attention: rotary, then the softmax in chunks of queries). Then summed over each
        2 x 2 merge group, and the window ordering of the vision tower undone.
        """
        received = capture.get("received")
        if received is None:
            attn = self.model.model.visual.blocks[-1].attn
            seq = capture["qkv"].shape[0]
            qkv = capture["qkv"].reshape(seq, 3, attn.num_heads, -1).permute(1, 0, 2, 3)
            cos, sin = capture["rotary"]
            query, key = self.apply_rotary(qkv[0], qkv[1], cos, sin)
            boundaries = [int(v) for v in capture["cu_seqlens"].tolist()]
            received = mean_attention_received(query, key, boundaries, attn.scaling)  # (seq,) window order
        seq = received.shape[0]
        unit = self.merge * self.merge
        per_token = received.reshape(seq // unit, unit).sum(-1)  # one value per merged token
        return self.window_to_raster(per_token, grid_thw)

    @staticmethod
    def apply_rotary(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The vision tower's own rotary embedding of q and k."""
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

        return apply_rotary_pos_emb_vision(query, key, cos, sin)

    def window_to_raster(self, values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Reorder per-merged-token values from the vision tower's window order to raster order,
        exactly as the tower reorders its merger output."""
        from transformers.vision_utils import get_vision_window_index

        vision = self.model.config.vision_config
        window_index, _ = get_vision_window_index(grid_thw, vision.spatial_merge_size, vision.window_size,
                                                  vision.patch_size)
        return values[torch.argsort(window_index.to(values.device))]

    # ----------------------------------------------------------------------------------------
    # language model

    def positions(self, inputs: Any) -> torch.Tensor:
        """M-RoPE positions (3, B, L) of the uncompressed prompt, by the rule the checkpoints were
        trained with (`positions.qwen2_5_vl_positions`; transformers 5.23's `get_rope_index` is not
        used: it starts the text after a video inside the video's time axis)."""
        vision = self.model.config.vision_config
        return qwen2_5_vl_positions(
            inputs["mm_token_type_ids"], vision.spatial_merge_size, vision.tokens_per_second,
            video_grid_thw=inputs.get("video_grid_thw"), second_per_grid_ts=inputs.get("second_per_grid_ts"),
            image_grid_thw=inputs.get("image_grid_thw"), attention_mask=inputs.get("attention_mask"),
        )

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   compressed: Any = None) -> dict[str, Any]:
        """Inputs for generate() with only the kept visual tokens, each at its original position.

        features: (M, D) the tokens to place, in the order of `kept`; kept: (M,) ascending flat
        indices into the video's T*N tokens. The 3-D M-RoPE positions of the full sequence are
        computed first (`positions`); the dropped video tokens are then removed from input_ids, the
        attention mask and the positions, so every kept token, and all text including the text after
        the video (max over the whole video + 1), keeps its uncompressed position. Returns
        `position_ids` (4, B, L'): row 0 the sequence index 0..L'-1, rows 1-3 M-RoPE. generate()
        continues every row at its last value + 1 for each new token.
        """
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        refuse_order(compressed)
        encoded = BaseModelOutputWithPooling(pooler_output=(features.to(self.model.dtype),))
        return {**self.kept_sequence(inputs, kept), "mm_encoder_outputs": {"video": encoded}}

    def kept_sequence(self, inputs: Any, kept: torch.Tensor) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask and position_ids (4, B, L') of the prompt with only the video
        tokens at flat indices `kept` left, every token at its uncompressed position."""
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        positions = self.positions(inputs)  # (3, B, L)
        video = ids == self.video_token_id
        keep = ~video
        for b in range(ids.shape[0]):
            slots = video[b].nonzero().flatten()
            keep[b, slots[kept.to(slots.device)]] = True
        batch = ids.shape[0]
        new_ids = ids[keep].view(batch, -1)
        new_mask = mask[keep].view(batch, -1)
        kept_positions = positions.permute(1, 2, 0)[keep].view(batch, -1, 3).permute(2, 0, 1)
        sequence = torch.arange(new_ids.shape[1], device=ids.device).view(1, 1, -1).expand(1, batch, -1)
        position_ids = torch.cat([sequence, kept_positions.to(ids.device)], 0)
        return {"input_ids": new_ids, "attention_mask": new_mask, "position_ids": position_ids}

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]:
        """(LLM prefill FLOPs for `llm_tokens` tokens, vision encoder FLOPs for this video)."""
        from transformers.vision_utils import get_vision_window_index

        from ..flops import llm_prefill_flops, vision_flops

        vision = self.model.config.vision_config
        grid = inputs["video_grid_thw"][0]
        _, bounds = get_vision_window_index(grid[None].cpu(), vision.spatial_merge_size, vision.window_size,
                                            vision.patch_size)
        windows = (bounds[1:] - bounds[:-1]).tolist()
        return (llm_prefill_flops(self.model.config.text_config, llm_tokens),
                vision_flops(vision, grid.tolist(), windows))
