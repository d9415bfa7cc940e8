"""Which frames of a video to take, and the report of what was taken (no torch: the command line
builds a `Sampling` before the slow imports)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import DEFAULT_MAX_FRAMES, SAMPLING_RULES as RULES


@dataclass(frozen=True)
class Sampling:
    """Which frames to take: `frames` uniformly in time (None: the model's default), or `fps` per
    second capped at `max_frames` (subsampled uniformly beyond); `max_pixels` / `min_pixels` per
    frame (None: the backbone's own; Qwen models); `decoder` "auto" | "decord" | "pyav"; `rule`:
    "centre" (the frame shown at the centre of each of `n` equal parts of the duration) or an
    evaluation harness's way,
    "linspace" (qwen-vl-utils: indices `round(linspace(0, total - 1, n))`) / "linspace-floor"
    (lmms-eval's LLaVA loaders: truncated), see docs/video.md; `keyframes`: each frame is the key frame
    nearest its planned time, read alone (fast on long videos; docs/video.md, "Key frames")."""

    frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    max_pixels: int | None = None
    decoder: str = "auto"
    rule: str = "centre"
    min_pixels: int | None = None
    keyframes: bool = False  # each frame the key frame nearest its planned time (video.sample_frames)
    # frames prepared at a time (decode -> preprocess -> encode -> compress, `chunked.prepare_chunked`): "auto"
    # (chosen from the model's frame size and the memory at hand, `chunked.auto_chunk`), "all" (every frame at
    # once) or a number; the result does not depend on it, so the reuse cache's key leaves it out
    chunk_frames: int | str = "auto"

    def __post_init__(self) -> None:
        if self.frames is not None and self.fps is not None:
            raise ValueError("give frames or fps, not both")
        if self.frames is not None and (isinstance(self.frames, bool) or self.frames < 1):
            raise ValueError(f"frames must be >= 1, got {self.frames}")
        if self.fps is not None and not (self.fps > 0 and math.isfinite(self.fps)):
            raise ValueError(f"fps must be > 0, got {self.fps}")
        if self.max_frames is not None:
            if self.fps is None:
                raise ValueError("max_frames caps sampling by fps: give fps too (or a frame count alone)")
            if self.max_frames < 1:
                raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")
        for name in ("max_pixels", "min_pixels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if isinstance(self.chunk_frames, str):
            if self.chunk_frames not in ("auto", "all"):
                raise ValueError(f"chunk_frames must be auto, all or a number >= 1, got {self.chunk_frames!r}")
        elif isinstance(self.chunk_frames, bool) or not isinstance(self.chunk_frames, int) or self.chunk_frames < 1:
            raise ValueError(f"chunk_frames must be auto, all or a number >= 1, got {self.chunk_frames!r}")
        if self.rule not in RULES:
            raise ValueError(f"unknown sampling rule {self.rule!r}: choose one of {', '.join(RULES)}")

    @classmethod
    def grounding(cls, fps: float = 2.0, max_frames: int | None = DEFAULT_MAX_FRAMES, **kwargs) -> "Sampling":
        """`ground`'s default: 2 frames a second, at most 768."""
        return cls(fps=fps, max_frames=max_frames, **kwargs)

    @classmethod
    def default_for(cls, video: Any) -> "Sampling":
        """A decoded clip (video.Video) is taken as asked for, its own frame count; a file gets the
        model's default count."""
        return cls(frames=len(video.indices)) if hasattr(video, "indices") else cls()

    def decode(self, path: str | Path, default_frames: int, start: float | None = None, end: float | None = None,
               frame_rate: float | None = None, resize: Any = None):
        """Sample the file (a video.Video), or only its part [start, end] s; raises video.VideoError
        for an unusable file. A folder of frame images is read at `frame_rate` frames a second
        (default video.DEFAULT_FRAME_RATE). `resize`: the size frames leave the decoder at
        (a video.FrameResize, e.g. a backbone's `frame_resize()`; None: as decoded)."""
        from .video import sample_fps, sample_frames

        return self._take(sample_fps, sample_frames, path, default_frames, start, end, frame_rate, resize)

    def stream(self, path: str | Path, default_frames: int, start: float | None = None, end: float | None = None,
               frame_rate: float | None = None, resize: Any = None):
        """`decode`'s sample (the same arguments and errors) as a video.StreamedVideo: the plan at once,
        the frames handed out by its `chunks(n)`, n at a time, so that memory holds about two chunks of
        frames, not the whole sample (long videos)."""
        from .video import stream_fps, stream_frames

        return self._take(stream_fps, stream_frames, path, default_frames, start, end, frame_rate, resize)

    def _take(self, by_rate, by_count, path, default_frames: int, start, end, frame_rate, resize):
        """`by_rate(path, fps, cap, ...)` or `by_count(path, frames, ...)` with this sampling's settings."""
        common = {"decoder": self.decoder, "start": start, "end": end, "frame_rate": frame_rate, "rule": self.rule,
                  "resize": resize, "keyframes": self.keyframes}
        if self.fps is not None:
            cap = None if self.max_frames is None else max(2, self.max_frames)
            return by_rate(path, self.fps, cap, **common)
        return by_count(path, self.frames or default_frames, **common)

    def describe(self, clip, default_frames: int) -> dict[str, Any]:
        """The frames report: what was asked for, what was sampled, and why they differ."""
        count, total = len(clip.indices), clip.total_frames
        notes: list[str] = []
        stated = getattr(clip, "stated_duration", None)
        truncated = bool(getattr(clip, "truncated", False))
        if truncated:  # the frames end clearly before the header's length (video.Timeline.cut_short)
            notes.append(f"the file ends at {clip.timeline.duration:.2f} s; its header says {stated:.1f} s: truncated?")
        if self.fps is None:
            requested = target = self.frames or default_frames
        elif self.rule != "centre":  # qwen-vl-utils smart_nframes
            from .video import HARNESS_MIN_FRAMES, harness_frames

            exact = harness_frames(total, getattr(clip.timeline, "average_fps", 0) or 0, clip.duration, self.fps)
            requested = target = max(int(math.floor(exact + 1e-9)), HARNESS_MIN_FRAMES)
            if exact < HARNESS_MIN_FRAMES:
                notes.append(f"{self.fps:g} fps is {exact:.1f} frames here: at least {HARNESS_MIN_FRAMES} "
                             "(qwen-vl-utils' minimum)")
        else:
            requested = target = int(math.floor(clip.duration * self.fps + 1e-9))
        subsampled = self.max_frames is not None and requested > self.max_frames
        if subsampled:
            target = self.max_frames
            notes.append(f"{self.fps:g} fps over {clip.duration:.1f} s is {requested} frames: subsampled "
                         f"uniformly to at most {self.max_frames} (max frames)")
        if target > total:
            target = total
            notes.append(f"{requested} frames asked for, the video has only {total}")
        if count != target:
            notes.append(f"{target} frames asked for, {count} taken: the sample is an even number, at least 2")
        keyframes = bool(getattr(clip, "keyframes", False))
        offsets = None
        if keyframes and clip.planned is not None:
            offsets = [round(t - p, 4) for t, p in zip(clip.timestamps, clip.planned)]
            far = max((abs(o) for o in offsets), default=0.0)
            mean = sum(abs(o) for o in offsets) / max(len(offsets), 1)
            repeats = count - len(set(clip.indices))
            notes.append(f"key frames only: each frame is the key frame nearest its planned time ({mean:.2f} s from "
                         f"it on average, {far:.2f} s at most)" + (f"; {repeats} repeated, the file has too few key "
                                                                  "frames" if repeats else ""))
        return {"requested": requested, "count": count, "fps": self.fps, "max_frames": self.max_frames,
                "rule": self.rule, "subsampled": subsampled, "notes": notes, "total": total,
                "timestamps": [round(t, 4) for t in clip.timestamps], "indices": list(clip.indices),
                "duration": clip.duration, "keyframes": keyframes, "keyframe_offsets": offsets,
                "stated_duration": stated, "truncated": truncated}
