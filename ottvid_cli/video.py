"""Video decoding with decord: true per-frame timestamps, uniform-in-time sampling.

Two sampling plans: `sample_frames(path, 32)` (question answering: a fixed, even number of frames)
and `sample_fps(path, 2.0, max_frames)` (grounding: a fixed rate). Both sample uniformly in *time*
over the container's duration, using each frame's real timestamp, so variable-frame-rate files
and files whose average fps is wrong still give correct times.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np


class VideoError(ValueError):
    """A video that cannot be used: missing, unreadable, or without frames. The message is one line."""


@dataclass
class Timeline:
    """Every frame's start time in seconds (repaired where the container's is invalid) and the duration."""

    starts: np.ndarray
    duration: float
    average_fps: float
    repaired: int = 0  # how many timestamps had to be interpolated
    source: str = "container"  # "container", or "average fps" when no timestamp was usable


@dataclass
class Video:
    """Sampled frames of one video file.

    frames: (n, H, W, 3) uint8 RGB; timestamps: start time of each sampled frame (s); indices: their
    frame numbers in the file; duration: the whole video's length (s).
    """

    path: str
    frames: np.ndarray
    timestamps: list[float]
    indices: list[int]
    duration: float
    total_frames: int
    average_fps: float
    timeline: Timeline = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the sample over the video's duration."""
        return len(self.indices) / self.duration if self.duration > 0 else float(len(self.indices))


def _open(path: str | os.PathLike):
    import decord

    path = os.fspath(path)
    if not os.path.exists(path):
        raise VideoError(f"video not found: {path}")
    if os.path.isdir(path):
        raise VideoError(f"expected a video file, got a folder: {path}")
    try:
        with _native_stderr_silenced():  # FFmpeg/decord log their own lines for unreadable files
            reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=0)
    except Exception as exc:  # decord raises its own DECORDError / RuntimeError types
        if "video stream" in str(exc):
            raise VideoError(f"video has no frames: {path} (no decodable video stream)") from None
        raise VideoError(f"cannot read video {path}: not a video file, or a format FFmpeg cannot decode") from None
    if len(reader) == 0:
        raise VideoError(f"video has no frames: {path}")
    return reader


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send what native code writes to file descriptor 2 to /dev/null for the duration."""
    try:
        saved = os.dup(2)
    except OSError:  # no usable descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def read_timeline(reader) -> Timeline:
    """Per-frame start times from the container, repaired where invalid.

    A timestamp is trusted when it is finite, non-negative and not before an earlier trusted one.
    An invalid one is interpolated between its valid neighbours (extrapolated with the median valid
    gap at the ends). Only when no timestamp is valid are times index / average fps. The duration is
    the last frame's end time from the container, or its repaired start plus one frame gap.
    """
    count = len(reader)
    average_fps = float(reader.get_avg_fps() or 0.0)
    try:
        stamps = np.asarray(reader.get_frame_timestamp(range(count)), dtype=np.float64).reshape(count, 2)
    except Exception:
        stamps = np.full((count, 2), np.nan)
    starts = stamps[:, 0].copy()
    valid = np.isfinite(starts) & (starts >= 0)
    running = -np.inf
    for i in range(count):  # non-decreasing among the trusted ones
        if valid[i]:
            if starts[i] < running:
                valid[i] = False
            else:
                running = starts[i]
    n_valid = int(valid.sum())
    if n_valid == 0:
        fps = average_fps if math.isfinite(average_fps) and average_fps > 0 else 30.0
        starts = np.arange(count) / fps
        return Timeline(starts=starts, duration=count / fps, average_fps=average_fps, repaired=count,
                        source="average fps")
    index = np.arange(count)
    good = index[valid]
    gaps = np.diff(starts[good])
    gap = float(np.median(gaps)) if gaps.size else (1.0 / average_fps if average_fps > 0 else 1 / 30)
    repaired = starts.copy()
    repaired[~valid] = np.interp(index[~valid], good, starts[good])
    before, after = index < good[0], index > good[-1]
    repaired[before] = np.maximum(starts[good[0]] - (good[0] - index[before]) * gap, 0.0)
    repaired[after] = starts[good[-1]] + (index[after] - good[-1]) * gap
    end = float(stamps[-1, 1])
    if valid[-1] and math.isfinite(end) and end >= repaired[-1]:
        duration = end
    else:
        duration = float(repaired[-1] + gap)
    return Timeline(starts=repaired, duration=max(duration, float(repaired[-1])), average_fps=average_fps,
                    repaired=count - n_valid)


def _frames_at(timeline: Timeline, count: int) -> list[int]:
    """Indices of the frames shown at `count` times spread uniformly over the duration (segment centres)."""
    centres = (np.arange(count) + 0.5) * timeline.duration / count
    idx = np.searchsorted(timeline.starts, centres, side="right") - 1
    return np.clip(idx, 0, len(timeline.starts) - 1).astype(int).tolist()


def _even(n: int) -> int:
    """Largest even number <= n, at least 2 (Qwen2.5-VL encodes frames in pairs)."""
    return max(2, n - n % 2)


def _decode(path: str, reader, timeline: Timeline, indices: list[int]) -> Video:
    try:
        frames = reader.get_batch(indices).asnumpy()
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VideoError(f"cannot decode frames of {path}: {reason[:120]}") from None
    return Video(
        path=path,
        frames=frames,
        timestamps=[float(timeline.starts[i]) for i in indices],
        indices=indices,
        duration=timeline.duration,
        total_frames=len(timeline.starts),
        average_fps=timeline.average_fps,
        timeline=timeline,
    )


def check_video(path: str | os.PathLike) -> None:
    """Raise VideoError if the file is missing, unreadable or has no frames (cheap: opens, decodes nothing)."""
    _open(path)


def sample_frames(path: str | os.PathLike, num_frames: int = 32) -> Video:
    """`num_frames` frames (made even; fewer for videos with fewer frames) uniformly in time."""
    if num_frames < 1:
        raise VideoError(f"the number of frames must be >= 1, got {num_frames}")
    reader = _open(path)
    timeline = read_timeline(reader)
    count = _even(min(num_frames, len(reader)))
    return _decode(os.fspath(path), reader, timeline, _frames_at(timeline, count))


def sample_fps(path: str | os.PathLike, fps: float = 2.0, max_frames: int | None = None) -> Video:
    """Frames at `fps` per second of duration (an even count, at least 2), uniformly in time.

    With `max_frames`, longer videos are subsampled uniformly to that many frames (made even).
    """
    if not (fps > 0 and math.isfinite(fps)):
        raise VideoError(f"fps must be > 0, got {fps}")
    if max_frames is not None and max_frames < 2:
        raise VideoError(f"max_frames must be >= 2, got {max_frames}")
    reader = _open(path)
    timeline = read_timeline(reader)
    count = int(math.floor(timeline.duration * fps + 1e-9))
    if max_frames is not None:
        count = min(count, max_frames)
    count = _even(min(count, len(reader)) if len(reader) >= 2 else count)
    return _decode(os.fspath(path), reader, timeline, _frames_at(timeline, count))
