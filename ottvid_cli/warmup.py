"""Warm start: one small request through a loaded model before the first real one (docs/attention.md).

A fresh process pays its first-call overheads on its first request: CUDA context and library handles,
kernels loaded on first use, allocator growth, lazily imported code, oneDNN primitives on the CPU.
`warm_up` pays them on a synthetic clip of two temporal groups at the backbone's own frame size,
through the very path a question takes (preprocess, vision encoder with saliency, OTT-Vid
compression, a short generation keeping the prompt's prefix, then a second question from that
prefix), so `serve` and `chat` report ready only once the model is warm, and `ask` can show what
the overheads cost. Nothing here prints.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

WARM_QUESTIONS = ("What happens in the video?", "What colour dominates?")


def warm_clip(backbone: Any, groups: int = 2, seed: int = 0):
    """A synthetic `Video`: `groups` temporal groups of noise frames at the side of the backbone's pixel
    cap (its preprocessing then sizes them as it sizes a real frame), two frames a second."""
    from .video import Video

    count = max(1, groups) * int(getattr(backbone, "frames_per_group", 1) or 1)
    side = int(math.sqrt(getattr(backbone, "max_pixels", None) or 448 * 448))
    frames = np.random.default_rng(seed).integers(0, 256, size=(count, side, side, 3), dtype=np.uint8)
    return Video(path="<warm-up>", frames=frames, timestamps=[i / 2 for i in range(count)],
                 indices=list(range(count)), duration=count / 2, total_frames=count, average_fps=2.0,
                 decoder="synthetic")


def warm_up(backbone: Any, max_new_tokens: int = 2) -> float:
    """Run one small question (and a second from its prefix) through `backbone`; returns the wall time
    in ms, also kept as `backbone.warmup_ms`. Nothing is cached: the engine's caches never see it."""
    from .pipeline import answer, prepare
    from .sampling import Sampling
    from .tasks import qa
    from .timing import synchronize

    start = time.perf_counter()
    clip = warm_clip(backbone)
    prepared = prepare(backbone, clip, Sampling(frames=len(clip.indices)), "ottvid",
                       prompt=qa.build_prompt(WARM_QUESTIONS[0]))
    first = answer(prepared, "ask", max_new_tokens, keep_prefix=True)
    if first.prefix is not None:
        answer(prepared.reprompt(qa.build_prompt(WARM_QUESTIONS[1])), "ask", max_new_tokens, prefix=first.prefix)
    synchronize(backbone.device)
    backbone.warmup_ms = (time.perf_counter() - start) * 1e3
    return backbone.warmup_ms
