"""Warm start: one small request through a loaded model before the first real one (docs/attention.md).

A fresh process pays its first-call overheads on its first request: CUDA context and library handles,
kernels loaded on first use, allocator growth, lazily imported code, oneDNN primitives on the CPU.
`warm_up` pays them on a synthetic clip of the default request's shape (its default frame count at the
backbone's own frame size: the kernels, GEMM plans and Triton specialisations a first real request
needs are then the ones already made), through the very path a question takes (a small video file
decoded and resized as a request's is, preprocess, vision encoder with saliency, OTT-Vid compression, a
short generation keeping the prompt's prefix, then a second question from that prefix), so `serve` and
`chat` report ready only once the model is warm, and `ask` can show what the overheads cost. Nothing
here prints.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

import numpy as np

WARM_QUESTIONS = ("What happens in the video?", "What colour dominates?")


def warm_clip(backbone: Any, groups: int | None = None, seed: int = 0):
    """A synthetic `Video`: `groups` temporal groups (default: as many as the backbone's default frame
    count makes, the shape of a default request) of noise frames at the side of the backbone's pixel cap
    (its preprocessing then sizes them as it sizes a real frame), two frames a second."""
    from .video import Video

    per_group = int(getattr(backbone, "frames_per_group", 1) or 1)
    if groups is None:
        groups = -(-int(getattr(backbone, "default_frames", 2 * per_group) or 2 * per_group) // per_group)
    count = max(1, groups) * per_group
    side = int(math.sqrt(getattr(backbone, "max_pixels", None) or 448 * 448))
    frames = np.random.default_rng(seed).integers(0, 256, size=(count, side, side, 3), dtype=np.uint8)
    return Video(path="<warm-up>", frames=frames, timestamps=[i / 2 for i in range(count)],
                 indices=list(range(count)), duration=count / 2, total_frames=count, average_fps=2.0,
                 decoder="synthetic")


def warm_decoder(backbone: Any, frames: int = 4) -> None:
    """Write a small video file (MPEG-4 Part 2, 64 x 64, `frames` frames) in a temporary folder and sample it
    as a request samples a file (PyAV, each frame resized for this backbone in the worker threads)."""
    import av

    from .pipeline import frame_resize
    from .sampling import Sampling
    from .video import sample_frames

    with tempfile.TemporaryDirectory(prefix="ottvid-warm-") as folder:
        path = os.path.join(folder, "warm.mp4")
        noise = np.random.default_rng(0).integers(0, 256, size=(frames, 64, 64, 3), dtype=np.uint8)
        with av.open(path, "w") as out:
            stream = out.add_stream("mpeg4", rate=2)
            stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
            for image in noise:
                out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            out.mux(stream.encode())
        sample_frames(path, frames, resize=frame_resize(backbone, Sampling(frames=frames)))


def _precompile(prepared: Any) -> None:
    """On the Triton backend, compile the compression kernels' variants for this request shape (their K
    block size is chosen by the content, so the warm clip alone would not reach them all)."""
    from .compression.backend import choose

    features, config = prepared.visual.features, prepared.config
    if config is None or choose(features.device) != "triton" or features.device.type != "cuda":
        return
    from .compression import kernels

    kernels.precompile(features.device, max(1, features.shape[0] - 1), features.shape[1], config.max_iter,
                       config.sinkhorn_stop == "tol")


def warm_up(backbone: Any, max_new_tokens: int = 2, precompile: bool = True, prefill: Any = None) -> float:
    """Run one small question (and a second from its prefix) through `backbone`; returns the wall time
    in ms, also kept as `backbone.warmup_ms`. Nothing is cached: the engine's caches never see it.
    precompile: on CUDA with the Triton backend, compile every variant of the compression kernels a
    request of the default shape can need (its K block is chosen by the content: without this, the first
    real request compiled one, 0.66 s on an H200); Triton keeps them on disk for later processes.
    prefill: the engine's `PrefillRunner`, which then captures the CUDA graph of the default request's
    length bucket here (the first question runs through it)."""
    from .pipeline import answer, prepare
    from .sampling import Sampling
    from .tasks import qa
    from .timing import synchronize

    start = time.perf_counter()
    warm_decoder(backbone)
    clip = warm_clip(backbone)
    prepared = prepare(backbone, clip, Sampling(frames=len(clip.indices)), "ottvid",
                       prompt=qa.build_prompt(WARM_QUESTIONS[0]))
    if precompile:
        _precompile(prepared)
    first = answer(prepared, "ask", max_new_tokens, keep_prefix=True, prefill=prefill)
    if first.prefix is not None:
        answer(prepared.reprompt(qa.build_prompt(WARM_QUESTIONS[1])), "ask", max_new_tokens, prefix=first.prefix)
    synchronize(backbone.device)
    backbone.warmup_ms = (time.perf_counter() - start) * 1e3
    return backbone.warmup_ms
