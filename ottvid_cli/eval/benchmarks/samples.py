"""What a benchmark's annotations are read into: `Sample` (one question or grounding query), its two
kinds (`MC`, `GROUNDING`) and `EvalError`, the one-line error for bad benchmark input.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

MC = "mc"
GROUNDING = "grounding"


class EvalError(ValueError):
    """Bad benchmark input: one line naming the file and the line or record."""


@dataclass(frozen=True)
class Sample:
    """One question (or grounding query) of a benchmark.

    `video` is the file name the annotation gives (or the video id, for benchmarks whose files are
    named `<id>.<ext>`); `find_video` turns it into a path. `options` are the choices as the
    annotation writes them (Video-MME's carry their "A. " prefix, the others are bare text);
    `target` is the correct letter (MC) or `(start, end)` in seconds (grounding). `start`/`end`
    bound the part of the video a time-bounded MVBench question is about (see `find_video`).
    `frame_rate` is the rate of the benchmark's folders of frame images, where a video is one
    (MVBench's episodic_reasoning: 3 fps); None leaves video.DEFAULT_FRAME_RATE.
    """

    id: str
    benchmark: str
    kind: str
    video: str
    question: str
    target: Any
    options: tuple[str, ...] = ()
    category: str | None = None
    subset: str | None = None
    duration: float | None = None
    start: float | None = None
    end: float | None = None
    search: tuple[tuple[str, bool], ...] = ()
    by_stem: bool = False
    frame_rate: float | None = None  # frames a second where the video is a folder of frame images
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(string.ascii_uppercase[: len(self.options)])
