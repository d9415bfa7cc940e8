"""Probing a file: is it a readable regular file, which stream is the video, what its header says
(`Header`), and whether an index's frame times can be trusted for random access (`judge_index`)."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .timeline import VideoError


def checked_path(path: str | os.PathLike) -> str:
    """The path of a regular, non-empty file this process may read; a one-line VideoError otherwise.

    A pipe or device (`<(curl ...)`, /dev/stdin) is refused by name: the file is read several times
    (the header, the index, the frames), which a pipe cannot give, and its size of 0 is not "empty".
    A file that cannot be opened (no permission, ...) is refused with the system's reason, not as a
    file FFmpeg cannot read."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise VideoError(f"video not found: {path}")
    if os.path.isdir(path):
        raise VideoError(f"expected a video file, got a folder: {path}")
    if not os.path.isfile(path):
        raise VideoError(f"not a regular file (a pipe or device): {path}; save the video to a file first")
    if os.path.getsize(path) == 0:
        raise VideoError(f"video file is empty (0 bytes): {path}")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise VideoError(f"cannot open video {path}: {(exc.strerror or str(exc)).lower()}") from None
    return path



def unreadable(path: str) -> VideoError:
    """The one-line VideoError for a file FFmpeg cannot read (to raise)."""
    return VideoError(f"cannot read video {path}: not a video file, a damaged or incomplete one, "
                      "or a format FFmpeg cannot decode")



def pyav_file_errors() -> tuple[type[BaseException], ...]:
    """What PyAV raises for a file FFmpeg cannot read: its FFmpeg error classes, and OSError. Only
    these mean "cannot read video"; anything else (TypeError, AttributeError, ...) is a bug of ours
    or a PyAV change, and propagates as one (the CLI says "internal error")."""
    import av

    return (av.error.FFmpegError, OSError)



def _pyav_major() -> int:
    import av

    try:
        return int(str(av.__version__).split(".")[0])
    except ValueError:
        return 0



def _open_options() -> dict[str, Any]:
    """av.open's keyword arguments for reading. Before PyAV 19 the container's metadata tags are
    decoded as UTF-8 with `metadata_errors="strict"` unless told "ignore" (a tag in another encoding
    would raise); PyAV 19 removed the argument (tags are always read with surrogateescape)."""
    return {"metadata_errors": "ignore"} if _pyav_major() < 19 else {}



class _Quieted:
    """A library's log setting turned down while any thread is inside (`with`), put back when the last one
    leaves: several threads read files at once (decoding ahead, `workers`), and an unsynchronised turn down /
    put back pair could leave it down for good. `lower()` turns it down and returns how to put it back (None:
    nothing was changed). Only the library's own logging is touched, never the process's stderr."""

    def __init__(self, lower: Callable[[], Callable[[], None] | None]):
        self._lower = lower
        self._lock = threading.Lock()
        self._depth = 0
        self._undo: Callable[[], None] | None = None

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._undo = self._lower()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._undo is not None:
                undo, self._undo = self._undo, None
                undo()


_AV_LOG_QUIET = -8  # FFmpeg's AV_LOG_QUIET: no line is at or below it


def _lower_pyav_logging() -> Callable[[], None] | None:
    """PyAV hands FFmpeg's log lines to Python's `logging` only after `av.logging.set_level(level)`; by
    default it drops them. Where a level was set, none is passed on (errors are still recorded for PyAV's
    exception messages) until it is put back."""
    import av.logging

    level = av.logging.get_level()
    if level is None:
        return None
    av.logging.set_level(_AV_LOG_QUIET)  # an int, not None: a line another thread is logging compares with it
    return lambda: av.logging.set_level(level)


ffmpeg_quiet = _Quieted(_lower_pyav_logging)  # held while PyAV reads a file (`pyav_stream`)


ATTACHED_PIC = 0x0400  # AV_DISPOSITION_ATTACHED_PIC: a still picture (cover art) stored as a video stream



def _flags(disposition) -> int:
    """A stream's disposition as an int: PyAV 16+ gives an IntFlag, 14 and 15 a plain Flag (`.value`)."""
    return int(getattr(disposition, "value", disposition))



def _video_stream(container):
    """The video stream to read, None when there is none: the one FFmpeg's `av_find_best_stream`
    picks (decord reads the same one), among the streams that are not an attached
    picture. Cover art is a one-frame video stream to FFmpeg (in an M4A or MP3, the only one); the
    first video stream is not always the video."""
    moving = [s for s in container.streams.video if not _flags(s.disposition) & ATTACHED_PIC]
    if not moving:
        return None
    best = container.streams.best("video")
    return best if best in moving else moving[0]



@contextmanager
def pyav_stream(path: str) -> Iterator[tuple[Any, Any]]:
    """(container, its video stream: `_video_stream`) opened with PyAV, closed afterwards; one-line VideoErrors.

    FFmpeg's own log lines (warnings about damaged or oddly seeked streams) are not passed on meanwhile
    (`ffmpeg_quiet`).
    """
    import av

    with ffmpeg_quiet:
        try:
            container = av.open(path, **_open_options())
        except pyav_file_errors():  # av.error.* (InvalidDataError, ...), OSError: what the file causes
            raise unreadable(path) from None
        try:
            stream = _video_stream(container)
            if stream is None:
                kind = "audio only" if container.streams.audio else "no video stream"
                if container.streams.video:  # only attached pictures: an audio file's cover art
                    kind += ", with a cover picture"
                raise VideoError(f"video has no frames: {path} ({kind})")
            if stream.codec_context is None:  # PyAV opens no decoder: FFmpeg has none for this codec
                raise VideoError(f"cannot decode video {path}: FFmpeg has no decoder for its video codec")
            stream.thread_type = "AUTO"
            yield container, stream
        finally:
            container.close()



@dataclass
class Header:
    """What the container's header says about the video stream (seconds; None where it says nothing)."""

    frames: int  # 0 when the container does not count them
    average_fps: float  # 0.0 when unknown
    stream_duration: float | None
    container_duration: float | None
    start: float  # the stream's start time (s); frame times are measured from it
    start_pts: int | None
    time_base: Fraction
    other_streams: bool = False  # audio or other streams, which may outlast the video
    codec: str = ""
    format: str = ""  # FFmpeg's demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2"
    reordered: bool = False  # frames are decoded in another order than shown (B-frames)

    def stated_length(self) -> float | None:
        """The video's length as the header states it (s), None where it states none: the stream's own, else the
        file's where the video is alone in it (audio may outlast the video), less the stream's start (it may
        count from 0). In an AVI, at least its frame count over its rate: FFmpeg gives an AVI cut off before its
        index the length of the frames it finds as the stream's (an MP4's count includes frames an edit list
        leaves out, so it is not used there)."""
        stated = None
        whole = self.container_duration
        if self.stream_duration and math.isfinite(self.stream_duration) and self.stream_duration > 0:
            stated = self.stream_duration
        elif not self.other_streams and whole and math.isfinite(whole) and whole > max(self.start, 0.0):
            stated = whole - max(self.start, 0.0)
        if self.format.split(",")[0] == "avi" and self.frames and self.average_fps > 0:
            stated = max(stated or 0.0, self.frames / self.average_fps)
        return stated



def as_fraction(value: Any) -> Fraction | None:
    """A PyAV rational as a Fraction, None when unset: PyAV before 19 gives a Fraction or None for
    `time_base` / `average_rate`, PyAV 19 an AVRational that is falsy (0/1) when unset."""
    return Fraction(value.numerator, value.denominator) if value else None



def read_header(container: Any, stream: Any) -> Header:
    """What the header of `container` (an opened PyAV container) says about its video `stream`."""
    tb = as_fraction(stream.time_base) or Fraction(1, 1)
    rate = stream.average_rate
    return Header(
        frames=int(stream.frames or 0),
        average_fps=float(rate) if rate else 0.0,
        stream_duration=float(stream.duration * tb) if stream.duration else None,
        container_duration=container.duration / 1e6 if container.duration else None,
        start=float(stream.start_time * tb) if stream.start_time is not None else 0.0,
        start_pts=stream.start_time,
        time_base=tb,
        other_streams=len(container.streams) > 1,
        codec=stream.codec_context.name or "",
        format=container.format.name or "",
        reordered=bool(stream.codec_context.has_b_frames),
    )



def judge_index(starts: np.ndarray, duration: float, header: Header) -> str:
    """Why an index's frame times cannot be trusted for random access, or "" when they can.

    Trusted when every start is finite and >= 0, the starts strictly increase, the last frame ends after
    it starts, and three readings of
    the length agree within max(2 frame gaps, 5%): the frames' span (`duration`, the last frame's end),
    frame count / average fps, and the container's duration (the stream's own, else the file's; it may
    count from 0 or from the stream's start). The header's frame count, where given, must match too.
    """
    n = len(starts)
    bad = int(np.sum(~np.isfinite(starts) | (starts < -1e-6)))
    if bad:
        return f"{bad} of {n} frames have invalid timestamps"
    if n > 1 and np.any(np.diff(starts) <= 0):
        return "frame timestamps do not strictly increase"
    if not (math.isfinite(duration) and duration > starts[-1]):
        return "the last frame has no valid end time"
    gap = float(np.median(np.diff(starts))) if n > 1 else duration
    tol = max(2 * gap, 0.05 * duration, 1e-3)
    if header.frames and abs(header.frames - n) > max(1, 0.01 * n):
        return f"the container counts {header.frames} frames, its index {n}"
    if n > 1 and header.average_fps > 0 and abs(n / header.average_fps - duration) > tol:
        return (f"{n} frames at the average {header.average_fps:.3f} fps last {n / header.average_fps:.2f} s, "
                f"the timestamps span {duration:.2f} s")
    stated = [d for d in (header.stream_duration, header.container_duration) if d and math.isfinite(d)]
    if not stated:
        return "the container states no duration"
    if any(min(abs(d - duration), abs(d - header.start - duration)) <= tol for d in stated):
        return ""
    if header.stream_duration is None and header.other_streams and stated[0] > duration:
        return ""  # the file's duration covers its audio too, which may outlast the video
    return f"the container says {stated[0]:.2f} s, the frame timestamps span {duration:.2f} s"
