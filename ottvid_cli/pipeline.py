"""One preparation path, and the runs built on it.

`prepare()` decodes a video, preprocesses it, runs the vision encoder and compresses the visual
tokens; its `Prepared` keeps the encoder output, so `recompress()` tries another ratio or method
without encoding again. `answer` adds generation and reply parsing on top and returns a `RunResult`
(plain data; `to_dict()` is the documented JSON). The front door for questions is `session.Engine`
(`ask` / `ground`: prompt, prepare with reuse, answer); `show` and `profile` reuse `prepare()` too.
Nothing here prints.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .chunked import checked_prompt, chunk_size, fit_tokens, planned_size, prepare_chunked
from .compression import Compressed, OTTVidConfig, token_counts
from .prepared import (PREPROCESS_LOCK, Prepared, check_method, compress_visual, default_config, frame_resize,
                       pixel_range)
from .sampling import Sampling
from .checks import STAGES
from .tasks import grounding, qa
from .timing import Stopwatch
from .video import Video

DESCRIBE = "Describe the video."

__all__ = ["DESCRIBE", "Drawing", "Loaded", "Prepared", "RunResult", "answer", "drawing", "frame_resize", "load",
           "plan_counts", "prepare"]


@dataclass
class Loaded:
    """A video decoded and preprocessed for a backbone, not yet encoded: what `load` makes (the CPU
    part of `prepare`, which may run in a background thread while the model works) and `prepare`
    takes instead of a file."""

    clip: Video = field(repr=False)
    sampling: Sampling
    prompt: str
    inputs: Any = field(repr=False)
    timings_ms: dict[str, float | None]


def load(backbone, video: str | Path | Video, sampling: Sampling | None = None, prompt: str = DESCRIBE,
         on_step: Callable[[str], None] | None = None, start: float | None = None, end: float | None = None,
         frame_rate: float | None = None) -> Loaded:
    """decode -> preprocess: the part of `prepare` that runs on the CPU (the processor's inputs are
    moved to the backbone's device). `video` is a file (only its part [`start`, `end`] s when given;
    a folder of frame images shown at `frame_rate` a second) or an already decoded `Video`. Safe to call
    from a background thread while the model runs (it times on the host clock, so it never waits for
    the device's queued work); preprocessing is serialised. The tokenizer it shares with the main
    thread's `reprompt` is used without padding or truncation everywhere, so no call changes its
    state (a fast tokenizer's only mutation, and the only way concurrent calls can collide)."""
    sampling = sampling or Sampling.default_for(video)
    step = on_step or (lambda name: None)
    watch = Stopwatch(torch.device("cpu"))
    if isinstance(video, Video):  # decoded already: nothing decoded here (its own time: `Video.decode_ms`)
        clip = video
    else:
        step("decode")
        with watch("decode"):
            clip = sampling.decode(video, backbone.default_frames, start, end, frame_rate=frame_rate,
                                   resize=frame_resize(backbone, sampling))
    step("preprocess")
    with watch("preprocess"), PREPROCESS_LOCK, pixel_range(backbone, sampling):
        inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, prompt,
                                     source_size=clip.source_size)
    return Loaded(clip=clip, sampling=sampling, prompt=prompt, inputs=inputs,
                  timings_ms={k: watch.ms.get(k) for k in ("decode", "preprocess")})


def prepare(backbone, video: str | Path | Video | Loaded, sampling: Sampling | None = None, method: str = "ottvid",
            config: OTTVidConfig | None = None, prompt: str = DESCRIBE, saliency: bool | None = None,
            timer: bool | None = None, on_step: Callable[[str], None] | None = None, keep: bool = False,
            max_visual_tokens: int | None = None, pictures: int | None = None) -> Prepared:
    """decode -> preprocess -> vision encoder (+ saliency) -> compress.

    video: a file, an already decoded `Video` (then nothing is decoded) or a `Loaded` (decoded and
    preprocessed by `load`: then `sampling` and `prompt` are its own). method: "ottvid", "none"
    or any name registered in compression.methods. config: the method's settings (default: the
    paper's OTT-Vid at ratio 0.1, or the method's own defaults); ignored with "none". saliency:
    compute it even for "none" (to recompress later); default: for every method but "none". timer:
    passed to `compress` (True for per-stage compression times; it synchronises the device per stage).

    A file whose sample is longer than `sampling.chunk_frames` is prepared chunk by chunk
    (`chunked.prepare_chunked`; the same result); with OTT-Vid its encoder output is then not kept
    (`Prepared.streamed`) unless `keep`. max_visual_tokens: the ratio is lowered so that at most this many
    visual tokens reach the LLM (`config.ratio` of the result is the one used). A prompt longer than the
    model's context is refused (ValueError) before the vision encoder runs. pictures: a chunked preparation
    keeps the frames a picture of at most this many tiles shows (`show.draw`); the one-shot path keeps all.
    """
    check_method(method)
    sampling = sampling or (video.sampling if isinstance(video, Loaded) else Sampling.default_for(video))
    config = config or default_config(method, backbone)
    decode_ms = None
    if isinstance(video, (str, Path)) and hasattr(backbone, "prompt_inputs"):
        if on_step is not None:
            on_step("decode")
        began = time.perf_counter()
        plan = sampling.stream(video, backbone.default_frames, resize=frame_resize(backbone, sampling))
        if len(plan.indices) > chunk_size(backbone, sampling, len(plan.indices)):
            return prepare_chunked(backbone, video, sampling, method, config, prompt, saliency, timer, on_step, keep,
                                   max_visual_tokens, plan=plan, pictures=pictures)
        # one chunk: the context checked before decoding, then the one-shot path (every frame kept: pictures)
        size = planned_size(backbone, sampling, plan, video)
        _, fitted = checked_prompt(backbone, sampling, plan, size, prompt, method, config, max_visual_tokens)
        config = fitted if method != "none" else config
        video = plan.to_video(_all_frames(plan))
        decode_ms = (time.perf_counter() - began) * 1e3
    loaded = video if isinstance(video, Loaded) else load(backbone, video, sampling, prompt, on_step)
    if decode_ms is not None:
        loaded.timings_ms["decode"] = decode_ms
    clip, sampling = loaded.clip, loaded.sampling
    step = on_step or (lambda name: None)
    if decode_ms is None and hasattr(backbone, "grid_of"):  # the context, and the tokens asked for, before encoding
        grid = backbone.grid_of(loaded.inputs)
        groups = -(-len(clip.indices) // backbone.frames_per_group)
        text = int(loaded.inputs["input_ids"].shape[-1]) - groups * grid[0] * grid[1]
        fitted = fit_tokens(backbone, groups, grid[0] * grid[1], text, method, config, max_visual_tokens)
        config = fitted if method != "none" else config
    watch = Stopwatch(backbone.device)
    step("vision")
    visual = backbone.encode(loaded.inputs, saliency=method != "none" if saliency is None else saliency, watch=watch)
    if method != "none":
        step("compression")
    compressed, compression_ms = compress_visual(backbone, visual, method, config, timer)
    timings = {**loaded.timings_ms, **{k: watch.ms.get(k) for k in ("vision", "saliency")}}
    timings["compression"] = compression_ms
    frames = sampling.describe(clip, backbone.default_frames)
    frames["frames_per_group"] = backbone.frames_per_group
    return Prepared(backbone=backbone, clip=clip, sampling=sampling, prompt=loaded.prompt, inputs=loaded.inputs,
                    visual=visual, method=method, config=config if method != "none" else None, compressed=compressed,
                    frames=frames, timings_ms=timings)


def _all_frames(plan) -> Any:
    """Every frame of a short sample in one array (its one chunk)."""
    import numpy as np

    chunks = list(plan.chunks(max(len(plan.indices), 1)))
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


# ------------------------------------------------------------------------------------------------
# answers (session.Engine's ask / ground)


@dataclass
class RunResult:
    """What one `Engine.ask` / `Engine.ground` run produced, as data; `to_dict()` is the documented JSON."""

    task: str
    answer: str
    letter: str | None
    span: list[float] | None
    tokens: dict[str, Any]
    timings_ms: dict[str, float | None]
    prepared: Prepared = field(repr=False)
    cache_hit: bool = False  # the prepared video came from the cache (session.Engine), not from the encoder
    cache_source: str | None = None  # on a hit, which cache held it: "memory" or "disk" (PreparedCache.source)
    prefix: Any = field(default=None, repr=False)  # the KV cache of the prompt's prefix this run used or kept
    prefilled_tokens: int | None = None  # tokens this run prefilled: the LLM input less a reused prefix
    span_note: str | None = None  # ground without a span: what the reply held ("one time, 7 s, not a start ...")
    # the full prefill padded to a length bucket (`backbones.graphed_prefill`): {"path": "cuda_graph" | "padded",
    # "bucket", "tokens"}; None: generate()'s own prefill (or a reused prefix)
    prefill_graph: dict[str, Any] | None = None

    @property
    def clip(self) -> Video:
        return self.prepared.clip

    @property
    def compressed(self) -> Compressed | None:
        return self.prepared.compressed

    @property
    def grid(self) -> tuple[int, int]:
        return self.prepared.visual.grid

    @property
    def frames(self) -> dict[str, Any]:
        return self.prepared.frames

    @property
    def compression(self) -> dict[str, Any] | None:
        """The compression report as plain data, with the method and its full config (None with
        method "none"): OTT-Vid's `CompressionReport` (K, B, merges, prunes, ...) or another
        method's `MethodReport` (M, kept, details, ...)."""
        p = self.prepared
        if p.compressed is None:
            return None
        report = p.compressed.report.to_dict()
        config = asdict(p.config) if is_dataclass(p.config) else report.get("config", {})
        return {"method": p.method, **report, "config": config}

    def to_dict(self) -> dict[str, Any]:
        p = self.prepared
        return {
            "task": self.task, "video": str(p.clip.path), "model": p.backbone.name, "device": str(p.backbone.device),
            "dtype": str(getattr(getattr(p.backbone, "model", None), "dtype", "")).removeprefix("torch.") or None,
            "method": p.method, "ratio": p.ratio, "prompt": p.prompt,
            "answer": self.answer, "letter": self.letter, "span": self.span,
            "frames": p.frames, "tokens": self.tokens,
            "compression": self.compression,
            "timings_ms": {"load": getattr(p.backbone, "load_ms", None), **_warmup_ms(p.backbone),
                           **{k: self.timings_ms.get(k) for k in STAGES}},
            "cache_hit": self.cache_hit, "cache_source": self.cache_source if self.cache_hit else None,
            "random_model": bool(getattr(p.backbone, "random_model", False)),  # a tiny random model's answer
            "prefill_graph": self.prefill_graph,
            **({"span_note": self.span_note} if self.task == "ground" else {}),
        }


def _warmup_ms(backbone: Any) -> dict[str, float]:
    """{"warmup": ms} when this process warmed the model up (`warmup.warm_up`), else {}."""
    ms = getattr(backbone, "warmup_ms", None)
    return {"warmup": ms} if ms is not None else {}


def answer(prepared: Prepared, task: str, max_new_tokens: int, on_step=None, on_token=None,
           options: list[str] | None = None, prefix: Any = None, keep_prefix: bool = False,
           cache_hit: bool = False, point: bool = False, prefill: Any = None) -> RunResult:
    """Generate the reply to `prepared.prompt` ("ask": with the chosen letter when `options` are given;
    "ground": with the span, one time read as a span only with `point`). `prefix` / `keep_prefix`:
    prefix reuse (`KeptTokenGeneration.generate`); the prefix the run used or kept is `result.prefix`.
    `prefill`: a `backbones.graphed_prefill.PrefillRunner` for the full prefill (None: generate()'s own)."""
    if on_step is not None:
        on_step("generate")
    generated = prepared.backbone.generate(prepared.inputs, prepared.features, prepared.kept,
                                           max_new_tokens=max_new_tokens, on_token=on_token,
                                           compressed=prepared.compressed, prefix=prefix, keep_prefix=keep_prefix,
                                           **({"prefill": prefill} if prefill is not None else {}))
    timings = {**prepared.timings_ms, "prefill": generated.prefill_ms, "generate": generated.generate_ms}
    result = RunResult(task=task, answer=generated.text, letter=None, span=None,
                       tokens=prepared.tokens(generated.llm_input_tokens, generated.new_tokens),
                       timings_ms=timings, prepared=prepared, cache_hit=cache_hit, prefix=generated.prefix,
                       prefilled_tokens=generated.prefilled_tokens,
                       prefill_graph=(generated.extra or {}).get("prefill"))
    if task == "ask":
        result.letter = qa.parse_letter(result.answer, options) if options else None
    else:
        span = grounding.parse_span(result.answer, prepared.clip.duration, point)
        result.span = list(span) if span is not None else None
        result.span_note = grounding.span_note(result.answer, point) if span is None else None
    return result


def plan_counts(groups: int, tokens: int, ratio: float = 0.1, gamma: float = 0.3) -> dict[str, Any]:
    """The tokens each OTT-Vid stage keeps for T groups of N tokens, before running anything."""
    OTTVidConfig(ratio=ratio, gamma=gamma)  # validates
    c = token_counts(groups, tokens, ratio, gamma)
    spatial = groups * tokens if ratio >= 1 else groups * c.K
    return {"T": groups, "N": tokens, "input": groups * tokens, "K": c.K, "after_spatial": spatial,
            "B_tot": c.B_tot, "output": spatial - c.B_tot, "M": c.M, "r_s": c.r_s, "r_t": c.r_t}


# ------------------------------------------------------------------------------------------------
# pictures


@dataclass
class Drawing:
    """What a picture of the kept tokens is drawn from (`show.write_picture` draws it): the decoded clip,
    the compression result, the token grid per frame group and the frames per group."""

    clip: Video
    compressed: Compressed
    grid: tuple[int, int]
    frames_per_group: int


def drawing(prepared: Prepared) -> Drawing:
    """What to draw for a prepared run; ValueError with method none (nothing was compressed)."""
    if prepared.compressed is None:
        raise ValueError("a picture of the kept tokens needs a compressing method (method none keeps every token)")
    return Drawing(prepared.clip, prepared.compressed, prepared.visual.grid, prepared.backbone.frames_per_group)
