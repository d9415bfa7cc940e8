"""The types every decoding path shares: the error, a stream's frame times (`Timeline`), the sampled
`Video`, and the sampling plans that choose frames on a timeline (counts, rates, the harnesses' rules,
a part [start, end] of the video)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..checks import DEFAULT_MAX_FRAMES, SAMPLING_RULES as RULES


class VideoError(ValueError):
    """A video that cannot be used: missing, unreadable, or without frames. The message is one line."""



@dataclass
class Timeline:
    """Every frame's start time in seconds, from the stream's start, and the duration (the last frame's end).

    trusted: whether the index these times came from passed the checks of `judge_index` (always False
    for times measured by decoding every frame, whose `problem` then says why that was needed).
    """

    starts: np.ndarray
    duration: float
    average_fps: float
    source: str = "container"  # "decord index", "pyav index", or "decoded frames"
    trusted: bool = True
    problem: str = ""  # why the index was not trusted ("" when it was)
    keys: np.ndarray | None = None  # indices of the key frames (ascending), None where unknown
    stated: float | None = None  # the length the file's header states (`Header.stated_length`), None: none

    @property
    def cut_short(self) -> bool:
        """Whether the frames end clearly before the header's length: by more than max(1 s, 5 %) of it (a file
        cut off, as an interrupted download or copy leaves it)."""
        if self.stated is None:
            return False
        return self.duration < self.stated - max(CUT_SHORT_S, CUT_SHORT_SHARE * self.stated)


CUT_SHORT_S, CUT_SHORT_SHARE = 1.0, 0.05  # `Timeline.cut_short`'s margin: max(1 s, 5 % of the stated length)



@dataclass
class Video:
    """Sampled frames of one video file.

    frames: (n, H, W, 3) uint8 RGB; timestamps: start time of each sampled frame (s, from the stream's
    start); indices: their frame numbers in the file (presentation order); duration: the whole video's
    length (s); decoder: the backend that produced the frames ("decord" or "pyav"). source_size: the
    frames' (height, width) as decoded (after the display rotation), before a `resize` shrank them.
    keyframes: each frame is the key frame nearest its planned time; `planned`: those times (s).
    group_frames: for a video prepared chunk by chunk, whose `frames` are not kept (empty), the first
    frame of the temporal groups a picture shows ({group: frame}), or None.
    """

    path: str
    frames: np.ndarray
    timestamps: list[float]
    indices: list[int]
    duration: float
    total_frames: int
    average_fps: float
    timeline: Timeline = field(repr=False, default=None)  # type: ignore[assignment]
    decoder: str = ""
    source_size: tuple[int, int] | None = None
    keyframes: bool = False
    planned: list[float] | None = None
    decode_ms: float | None = None  # how long sampling took (reading, decoding, resizing), where timed
    group_frames: dict[int, np.ndarray] | None = field(repr=False, default=None)

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the sample over the video's duration."""
        return len(self.indices) / self.duration if self.duration > 0 else float(len(self.indices))

    @property
    def stated_duration(self) -> float | None:
        """The whole file's length as its header states it (s), None where it states none."""
        return None if self.timeline is None else self.timeline.stated

    @property
    def truncated(self) -> bool:
        """Whether the file's frames end clearly before its header's length (`Timeline.cut_short`): a file cut
        off; the sample covers the frames there are."""
        return self.timeline is not None and self.timeline.cut_short



Plan = Callable[[Timeline], "list[int]"]

HARNESS_MIN_FRAMES = 4  # qwen-vl-utils FPS_MIN_FRAMES: the fewest frames its fps sampling takes



def frames_at(timeline: Timeline, count: int) -> list[int]:
    """Indices of the frames shown at `count` times spread uniformly over the duration (segment centres)."""
    centres = (np.arange(count) + 0.5) * timeline.duration / count
    idx = np.searchsorted(timeline.starts, centres, side="right") - 1
    return np.clip(idx, 0, len(timeline.starts) - 1).astype(int).tolist()



def _frames_linspace(timeline: Timeline, count: int, rule: str) -> list[int]:
    """Indices spread evenly over the frame indices, first and last included, as the evaluation
    harnesses take them: "linspace" rounds (qwen-vl-utils `_read_video_decord`:
    `torch.linspace(0, total - 1, n).round()`, what lmms-eval's Qwen2.5-VL / Qwen3-VL read),
    "linspace-floor" truncates (`np.linspace(0, total - 1, n, dtype=int)`, lmms-eval's LLaVA loaders)."""
    total = len(timeline.starts)
    if rule == "linspace":
        import torch

        return torch.linspace(0, total - 1, count).round().long().clamp(0, total - 1).tolist()
    return np.linspace(0, total - 1, count, dtype=int).tolist()



def _pick(timeline: Timeline, count: int, rule: str) -> list[int]:
    return frames_at(timeline, count) if rule == "centre" else _frames_linspace(timeline, count, rule)



def even(n: int) -> int:
    """Largest even number <= n, at least 2 (Qwen2.5-VL encodes frames in pairs)."""
    return max(2, n - n % 2)



def harness_frames(total: int, average_fps: float, duration: float, fps: float) -> float:
    """The frames qwen-vl-utils' `smart_nframes` wants at `fps`, before its bounds (at least
    `HARNESS_MIN_FRAMES`, at most the cap and the frame count, made even): frames / average fps x fps."""
    return total / average_fps * fps if average_fps > 0 else duration * fps



def plan_count(num_frames: int, rule: str = "centre") -> Plan:
    """The plan of `num_frames` frames (made even, at most the video's) spread over it by `rule`."""
    return lambda timeline: _pick(timeline, even(min(num_frames, len(timeline.starts))), rule)



def plan_rate(fps: float, max_frames: int | None, rule: str = "centre") -> Plan:
    """The plan of `fps` frames a second (made even, at most `max_frames`) spread over the video by `rule`."""
    def plan(timeline: Timeline) -> list[int]:
        total = len(timeline.starts)
        if rule != "centre":  # qwen-vl-utils smart_nframes: frames / average fps * fps, in [4, cap], even
            cap = min(max_frames or DEFAULT_MAX_FRAMES, total)
            wanted = harness_frames(total, timeline.average_fps, timeline.duration, fps)
            return _pick(timeline, even(int(min(max(wanted, HARNESS_MIN_FRAMES), cap))), rule)
        count = int(math.floor(timeline.duration * fps + 1e-9))
        if max_frames is not None:
            count = min(count, max_frames)
        return _pick(timeline, even(min(count, total) if total >= 2 else count), rule)

    return plan



def _nearest_keys(timeline: Timeline, indices: list[int]) -> list[int]:
    """The key frame nearest (in time) each planned frame, distinct where the video has enough key frames:
    then the assignment keeps the order and has the least total distance (dynamic programming over the
    planned frames and the key frames, O(n x keys) in numpy); otherwise each takes its nearest. Without
    a key frame (a part of the video between two), the planned frames themselves."""
    if timeline.keys is None or not len(timeline.keys):
        return list(indices)
    keys = np.asarray(timeline.keys, dtype=np.int64)
    planned = timeline.starts[np.asarray(indices, dtype=np.int64)]
    times = timeline.starts[keys]
    n, k = len(indices), len(keys)
    cost = np.abs(planned[:, None] - times[None, :])  # (n, k)
    if k < n or len(set(indices)) < n:  # too few key frames (or a plan that repeats frames): the nearest each
        return keys[cost.argmin(axis=1)].astype(int).tolist()
    # best[i, j]: least total distance of planned frames 0..i with frame i on key j (keys strictly increasing);
    # choice[i, j]: the key of frame i - 1 on that best assignment
    best = np.empty((n, k))
    choice = np.zeros((n, k), dtype=np.int64)
    best[0] = cost[0]
    columns = np.arange(k)
    for i in range(1, n):
        prev = best[i - 1]
        running = np.minimum.accumulate(prev)
        first = np.maximum.accumulate(np.where(prev <= running, columns, 0))  # argmin of prev[:j + 1]
        best[i, 0] = np.inf
        best[i, 1:] = cost[i, 1:] + running[:-1]
        choice[i, 1:] = first[:-1]
    j = int(np.argmin(best[-1]))
    picked = [j]
    for i in range(n - 1, 0, -1):
        j = int(choice[i, j])
        picked.append(j)
    return keys[np.asarray(picked[::-1])].astype(int).tolist()


def keyframe_plan(plan: Plan) -> Plan:
    """`plan`, each frame replaced by the key frame nearest it (`_nearest_keys`)."""
    def keyed(timeline: Timeline) -> list[int]:
        return _nearest_keys(timeline, plan(timeline))

    return keyed


def checked_rule(rule: str) -> str:
    """`rule` itself where it is a sampling rule (`RULES`); a one-line VideoError otherwise."""
    if rule not in RULES:
        raise VideoError(f"unknown sampling rule {rule!r}: choose one of {', '.join(RULES)}")
    return rule



def segment(timeline: Timeline, start: float | None, end: float | None) -> tuple[int, int, float, float]:
    """The frames shown in [start, end] s (first, last + 1) and the part's start and length (s)."""
    lo = max(0.0, start or 0.0)
    hi = timeline.duration if end is None else min(float(end), timeline.duration)
    if not hi > lo:
        raise VideoError(f"the part [{start}, {end}] s is not within the video ({timeline.duration:.2f} s)")
    first = max(int(np.searchsorted(timeline.starts, lo, side="right")) - 1, 0)
    last = max(int(np.searchsorted(timeline.starts, hi, side="left")), first + 1)
    return first, last, lo, hi - lo



def within(plan: Plan, start: float | None, end: float | None) -> Plan:
    """`plan` applied to the frames shown in [start, end] s only (indices stay the file's)."""
    if start is None and end is None:
        return plan

    def bounded(timeline: Timeline) -> list[int]:
        first, last, lo, length = segment(timeline, start, end)
        keys = None if timeline.keys is None else timeline.keys[(timeline.keys >= first) & (timeline.keys < last)] - first
        part = Timeline(starts=timeline.starts[first:last] - lo, duration=length, average_fps=timeline.average_fps,
                        source=timeline.source, trusted=timeline.trusted, problem=timeline.problem, keys=keys)
        return [first + i for i in plan(part)]

    return bounded



def error_reason(exc: Exception) -> str:
    """An exception's message as one short line (its first, at most 120 characters; else its type's name)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:120]
