"""A long video prepared chunk by chunk of temporal groups, so that memory follows the tokens kept.

decode -> preprocess -> vision encoder (+ saliency) -> compression run on `chunk` frames at a time: the
decoder works at most one chunk ahead in its own thread (`video.StreamedVideo.chunks`), a chunk's pixel
values and encoder activations are freed before the next chunk is encoded, and what stays is

- with OTT-Vid: each chunk reduced by `compression.stream.OTTVidStream` to its selected tokens and the
  costs of the pairs it closes; the budgets and the merge run after the last chunk. The encoder's output
  is not kept (`Prepared.streamed`): another ratio or method needs a new preparation.
- with another method, "none", or when the encoder output is to be kept (`keep=True`: the reuse cache,
  recompression in chat and eval): every chunk's features, joined along T, then compressed as before.

The features are those of the one-shot path (tests/test_chunked_encode.py) and the decisions those of
`compress` (tests/test_compress_stream.py), so the answer does not depend on the chunk size. The prompt's
token ids come from the plan alone (`prompt_inputs`), before any frame is encoded, which lets a prompt
the model's context cannot hold be refused before the slow work (`fit_tokens`).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from .compression import methods
from .compression.stream import OTTVidStream
from .interrupt import checkpoint
from .prepared import PREPROCESS_LOCK, Prepared, compress_visual, default_config, frame_resize, pixel_range
from .progress import advance
from .sampling import Sampling
from .timing import Stopwatch

# The encoder's working memory a chunk may take by default (`auto_chunk`): a share of the memory at hand,
# within these bounds (bytes).
AUTO_SHARE = 8
AUTO_MIN_BYTES, AUTO_MAX_BYTES = 64 << 20, 512 << 20
AUTO_MIN_FRAMES = 64  # never fewer by default: a question's usual 32 or 64 frames go through at once
# Frames at the model's size the decoder hands over at once (whole chunks), so that each decoding pass
# (its containers, threads and seeks) serves several chunks: 4K frames cost the decoder far more to start
# again than the frames it returns (`decode_frames`).
DECODE_BYTES = 128 << 20


def chunk_size(backbone: Any, sampling: Sampling, frames: int) -> int:
    """Frames per chunk for a sample of `frames` frames: `sampling.chunk_frames` ("all": every frame; a
    number; "auto": `auto_chunk`), made a multiple of the backbone's frames per group."""
    step = int(getattr(backbone, "frames_per_group", 1))
    wanted = sampling.chunk_frames
    if wanted == "all":
        return max(frames, step)
    if wanted == "auto":
        wanted = auto_chunk(backbone)
    return max(step, int(wanted) // step * step)


def auto_chunk(backbone: Any) -> int:
    """The default chunk: as many frames as fit in 1/AUTO_SHARE of the memory at hand (the device's free
    memory on a GPU, the host's available memory on the CPU), between AUTO_MIN_BYTES and AUTO_MAX_BYTES,
    at `encoder_bytes_per_frame` of the largest frame the model takes (a square of its max_pixels; 448 x 448
    for a model without a pixel range); at least AUTO_MIN_FRAMES, in whole temporal groups. It depends on
    the model and the machine, never on the video's length."""
    device = getattr(backbone, "device", torch.device("cpu"))
    budget = min(max(_free_bytes(device) // AUTO_SHARE, AUTO_MIN_BYTES), AUTO_MAX_BYTES)
    side = int(math.isqrt(int(getattr(backbone, "max_pixels", None) or 448 * 448)))
    per_frame = encoder_bytes_per_frame(backbone, (side, side))
    step = int(getattr(backbone, "frames_per_group", 1))
    return max(AUTO_MIN_FRAMES, budget // max(per_frame, 1)) // step * step


def encoder_bytes_per_frame(backbone: Any, frame_size: tuple[int, int]) -> int:
    """An estimate of the vision encoder's working memory per frame: the pixel values (float32, and the
    processor's two working copies) and, for each patch, a block's largest live activations (the input and
    q, k, v of width C, the MLP's hidden width I twice for a gated MLP, in the model's dtype), doubled for
    the allocator's slack."""
    model = getattr(backbone, "model", None)
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    patch = int(getattr(vision, "patch_size", 14) or 14)
    width = int(getattr(vision, "hidden_size", 1280) or 1280)
    inner = int(getattr(vision, "intermediate_size", 4 * width) or 4 * width)
    dtype = getattr(model, "dtype", torch.float32)
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    patches = max(1, (frame_size[0] // patch) * (frame_size[1] // patch))
    return 2 * patches * ((5 * width + 2 * inner) * size + 3 * 3 * patch * patch * 4)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# ------------------------------------------------------------------------------------------------
# the prompt and the model's context


def context_length(backbone: Any) -> int | None:
    """The most tokens the model's LLM takes (its config's max_position_embeddings), None when unknown."""
    config = getattr(getattr(backbone, "model", None), "config", None)
    text = getattr(config, "text_config", None) or config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if value else None


def fit_tokens(backbone: Any, groups: int, tokens: int, text_tokens: int, method: str, config: Any,
               max_visual_tokens: int | None = None) -> Any:
    """The config to run: `config` with its ratio lowered so that at most `max_visual_tokens` visual tokens
    reach the LLM (unchanged when it keeps no more already). ValueError, before anything is decoded or
    encoded, when the prompt (`text_tokens` of text and the visual tokens kept of `groups` x `tokens`) is
    longer than the model's context, naming the ratio and --max-visual-tokens that would fit."""
    if max_visual_tokens is not None:
        if isinstance(max_visual_tokens, bool) or int(max_visual_tokens) != max_visual_tokens or max_visual_tokens < 1:
            raise ValueError(f"max visual tokens must be a whole number >= 1, got {max_visual_tokens!r}")
        if method == "none":
            raise ValueError("--max-visual-tokens lowers the ratio of a compressing method: method none keeps "
                             "every token")
        if _kept(method, config, groups, tokens) > max_visual_tokens:
            config = replace(config, ratio=_ratio_for(method, config, groups, tokens, int(max_visual_tokens)))
    context = context_length(backbone)
    kept = _kept(method, config, groups, tokens)
    if context is None or kept + text_tokens <= context:
        return config
    room = context - text_tokens
    if room < 1:
        raise ValueError(f"the prompt's text alone is {text_tokens} tokens, more than {backbone.name}'s context of "
                         f"{context}")
    ratio = _ratio_for("ottvid" if method == "none" else method, config or _ottvid(), groups, tokens, room)
    raise ValueError(f"{groups * tokens} visual tokens kept to {kept}, plus {text_tokens} of text, is more than "
                     f"{backbone.name}'s context of {context} tokens: use --ratio {_floor(ratio)} or lower, or "
                     f"--max-visual-tokens {room}, or fewer frames")


def _kept(method: str, config: Any, groups: int, tokens: int) -> int:
    if method == "none":
        return groups * tokens
    count = methods.output_count(method, config, groups, tokens)
    return count if count is not None else max(1, round(config.ratio * groups * tokens))


def _ratio_for(method: str, config: Any, groups: int, tokens: int, most: int) -> float:
    """The largest ratio (to 1e-6) whose count is at most `most` tokens."""
    low, high = 0.0, min(1.0, config.ratio)
    for _ in range(40):
        middle = (low + high) / 2
        if middle > 0 and _kept(method, replace(config, ratio=middle), groups, tokens) <= most:
            low = middle
        else:
            high = middle
    if low <= 0:
        raise ValueError(f"no ratio keeps at most {most} of {groups * tokens} visual tokens")
    rounded = math.floor(low * 1e6) / 1e6  # a ratio a person can read (and type), still within `most`
    return rounded if rounded > 0 and _kept(method, replace(config, ratio=rounded), groups, tokens) <= most else low


def _floor(ratio: float) -> str:
    """The ratio for a message, rounded down (so that the number shown fits too)."""
    return f"{math.floor(ratio * 1e6) / 1e6:g}"


def _ottvid():
    from .compression import OTTVidConfig

    return OTTVidConfig()


# ------------------------------------------------------------------------------------------------
# the chunked preparation


def prepare_chunked(backbone: Any, video: str | Path, sampling: Sampling, method: str, config: Any, prompt: str,
                    saliency: bool | None = None, timer: bool | None = None,
                    on_step: Callable[[str], None] | None = None, keep: bool = False,
                    max_visual_tokens: int | None = None, plan: Any = None, pictures: int | None = None) -> Any:
    """`pipeline.prepare` for a video file, chunk by chunk (see the module's docstring); `keep`: keep the
    encoder's output (every chunk's features) even for OTT-Vid. `plan`: the video's `StreamedVideo` when
    the caller has it. `pictures`: keep the first frame of the groups a picture of at most this many tiles
    shows (`show.draw`: one group in ceil(T / pictures)), in `Video.group_frames`; no other frame is kept.
    Returns a `pipeline.Prepared` whose `timings_ms` add up each stage over the chunks ("decode": the
    time spent waiting for the decoder's frames)."""
    from .backbones import VisualTokens

    step = on_step or (lambda name: None)
    host, watch = Stopwatch(torch.device("cpu")), Stopwatch(backbone.device)
    config = config if config is not None or method == "none" else default_config(method, backbone)
    want_saliency = method != "none" if saliency is None else saliency
    streaming = method == "ottvid" and not keep and config.ratio < 1.0
    if plan is None:
        step("decode")
        with host("decode"):
            plan = sampling.stream(video, backbone.default_frames, resize=frame_resize(backbone, sampling))
    total = len(plan.indices)
    per_group = int(backbone.frames_per_group)
    groups = -(-total // per_group)
    size = planned_size(backbone, sampling, plan, video)

    def prompt_for(size: tuple[int, int]) -> tuple[Any, Any, Any]:
        """The whole prompt, checked (`checked_prompt`), and the streamed compressor for it."""
        inputs, fitted = checked_prompt(backbone, sampling, plan, size, prompt, method, config, max_visual_tokens)
        grid = backbone.grid_of(inputs)
        return inputs, fitted, OTTVidStream(groups, grid, fitted, timer=timer) if streaming else None

    with host("preprocess"):
        inputs, config, compressor = prompt_for(size)
    chunk = chunk_size(backbone, sampling, total)
    chunks = _split(plan.chunks(decode_frames(chunk, size, total)), chunk)
    held: list[Any] = []
    done = 0
    every = -(-groups // pictures) if pictures else 0  # a picture shows one group in `every`
    firsts: dict[int, Any] = {}
    try:
        while True:
            with host("decode"):
                frames = next(chunks, None)
            if frames is None:
                break
            with host("preprocess"):
                if done == 0 and tuple(frames.shape[1:3]) != tuple(size):  # the first frame was not the sample's size
                    size = tuple(frames.shape[1:3])
                    inputs, config, compressor = prompt_for(size)
                with PREPROCESS_LOCK, pixel_range(backbone, sampling):
                    pixels = backbone.pixel_inputs(frames, source_size=plan.source_size)
            count = int(frames.shape[0])
            if every:  # the first frame of each group the picture shows
                for i in range(-done % per_group, count, per_group):
                    if (done + i) // per_group % every == 0:
                        firsts[(done + i) // per_group] = frames[i].copy()
            del frames
            if done == 0:
                step("vision")
            visual = backbone.encode(pixels, saliency=want_saliency, watch=watch)
            del pixels
            if compressor is not None:
                with watch("compression"):
                    compressor.add(visual.features, visual.saliency, visual.extra.get("deepstack", ()))
            else:
                held.append(visual)
            del visual
            done += count
            advance("encode", done, total)
            checkpoint("the chunked preparation")
    finally:
        chunks.close()
    if done == 0:
        raise ValueError(f"no frames were decoded from {video}")
    if compressor is not None:
        step("compression")
        with watch("compression"):
            compressed = compressor.finish()
        visual = VisualTokens(features=torch.empty(groups, compressor.tokens, compressed.features.shape[-1],
                                                   device="meta"),
                              saliency=None, grid=compressor.grid)
    else:
        visual = join_visual(held)
        held.clear()
        if "deepstack" in visual.extra:
            inputs.ottvid_deepstack = visual.extra["deepstack"]  # for Qwen3-VL's llm_inputs (one-shot layout)
        if method != "none":
            step("compression")
        compressed, ms = compress_visual(backbone, visual, method, config, timer)
        if ms is not None:
            watch.ms["compression"] = watch.ms.get("compression", 0.0) + ms
    clip = _frameless(plan, firsts if pictures else None)
    timings = {**{k: host.ms.get(k) for k in ("decode", "preprocess")},
               **{k: watch.ms.get(k) for k in ("vision", "saliency", "compression")}}
    if method == "none":
        timings["compression"] = None
    frames_report = sampling.describe(clip, backbone.default_frames)
    frames_report["frames_per_group"] = per_group
    frames_report["chunk_frames"] = min(chunk, total)
    return Prepared(backbone=backbone, clip=clip, sampling=sampling, prompt=prompt, inputs=inputs, visual=visual,
                    method=method, config=config if method != "none" else None, compressed=compressed,
                    frames=frames_report, timings_ms=timings, streamed=compressor is not None)


def decode_frames(chunk: int, size: tuple[int, int], total: int) -> int:
    """Frames the decoder hands over at once: whole chunks of `chunk` frames of `size` (height, width),
    as many as DECODE_BYTES holds (at least one chunk), at most the sample's `total`. The decoder's memory
    is then its own (containers, threads, a few frames at the source's size) plus two such batches, and it
    starts again once per batch, not once per chunk."""
    per_chunk = max(1, chunk * size[0] * size[1] * 3)
    return min(max(chunk, DECODE_BYTES // per_chunk * chunk), max(total, chunk))


def _split(batches: Any, chunk: int) -> Any:
    """The frames of each batch (`StreamedVideo.chunks`) in chunks of `chunk` (views, no copy); closing
    this generator closes the batches' (and stops their decoder)."""
    try:
        for batch in batches:
            for start in range(0, len(batch), chunk):
                yield batch[start:start + chunk]
    finally:
        batches.close()


def planned_size(backbone: Any, sampling: Sampling, plan: Any, video: str | Path) -> tuple[int, int]:
    """The (height, width) the plan's frames will come out of the decoder at, known before any is decoded:
    the backbone's resize (`pipeline.frame_resize`) of the first frame's shown size for the whole sample."""
    from .video import shown_size

    source = shown_size(video)
    resize = frame_resize(backbone, sampling)
    return tuple(resize.size(*source, len(plan.indices))) if resize is not None else source


def checked_prompt(backbone: Any, sampling: Sampling, plan: Any, size: tuple[int, int], prompt: str, method: str,
                   config: Any, max_visual_tokens: int | None = None) -> tuple[Any, Any]:
    """(the prompt's inputs for the plan's frames at `size`, the config to run): built from the plan alone
    (`prompt_inputs`, no pixels) and checked against the model's context, the config fitted to
    `max_visual_tokens` (`fit_tokens`), before any frame is decoded or encoded."""
    total = len(plan.indices)
    groups = -(-total // int(backbone.frames_per_group))
    with PREPROCESS_LOCK, pixel_range(backbone, sampling):
        inputs = backbone.prompt_inputs(total, size, plan.timestamps, plan.duration, prompt)
    grid = backbone.grid_of(inputs)
    text = int(inputs["input_ids"].shape[-1]) - groups * grid[0] * grid[1]  # a newline token counts as text
    return inputs, fit_tokens(backbone, groups, grid[0] * grid[1], text, method, config, max_visual_tokens)


def join_visual(parts: list[Any]) -> Any:
    """The chunks' `VisualTokens` joined along T: features, saliency, each extra (tuples of tensors layer by
    layer) and each tensor signal; the rest of a signal (a source's name) from the first chunk."""
    from .backbones import VisualTokens

    first = parts[0]
    if len(parts) == 1:
        return first

    def cat(values: list[Any]) -> Any:
        if torch.is_tensor(values[0]):
            return torch.cat(values)
        if isinstance(values[0], (tuple, list)):
            return tuple(cat([v[i] for v in values]) for i in range(len(values[0])))
        return values[0]

    saliency = None if first.saliency is None else torch.cat([p.saliency for p in parts])
    return VisualTokens(features=torch.cat([p.features for p in parts]), saliency=saliency, grid=first.grid,
                        extra={k: cat([p.extra[k] for p in parts]) for k in first.extra},
                        signals={k: cat([p.signals[k] for p in parts]) for k in first.signals})


def _frameless(plan: Any, firsts: dict[int, Any] | None = None) -> Any:
    """The plan as a `video.Video` with no frames kept (a chunked preparation frees each chunk's) but
    `firsts`, the first frames of some groups for a picture (`group_frames`)."""
    import numpy as np

    from .video import Video

    height, width = plan.size or (0, 0)
    return Video(path=plan.path, frames=np.zeros((0, height, width, 3), dtype=np.uint8),
                 timestamps=list(plan.timestamps), indices=list(plan.indices), duration=plan.duration,
                 total_frames=plan.total_frames, average_fps=plan.average_fps, timeline=plan.timeline,
                 decoder=plan.decoder, source_size=plan.source_size, keyframes=plan.keyframes,
                 planned=None if plan.planned is None else list(plan.planned), group_frames=firsts)
