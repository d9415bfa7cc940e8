"""Probing a file: is it a readable regular file, which stream is the video, what its header says
(`Header`), and whether an index's frame times can be trusted for random access (`judge_index`)."""

from __future__ import annotations

import math
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from .timeline import VideoError


def _checked_path(path: str | os.PathLike) -> str:
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



def _unreadable(path: str) -> VideoError:
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



_SILENCE = threading.Lock()
# how many are inside; descriptor 2 as it was before the first; (Python's sys.stderr, the stand-in for it)
_silenced: dict[str, Any] = {"depth": 0, "saved": None, "python": None}


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send what native code writes to file descriptor 2 to /dev/null for the duration. Safe in several
    threads at once (decoding ahead): the first in saves descriptor 2, the last out puts it back; two
    unsynchronised save / restore pairs could restore /dev/null and silence the process for good.

    Python's own writes to stderr (progress, warnings, errors: a long video is decoded while the rest of
    the run goes on) still reach it: while silenced, `sys.stderr`, where it is the process's descriptor 2,
    writes to the saved descriptor instead."""
    with _SILENCE:
        if _silenced["depth"] == 0:
            try:
                saved = os.dup(2)
            except OSError:  # no usable descriptor 2: nothing to silence
                saved = None
            if saved is not None:
                _flush_python_stderr()
                real = _real_stderr()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                os.close(devnull)
                _silenced["python"] = _python_stderr_to(real)
            _silenced["saved"] = saved
        _silenced["depth"] += 1
    try:
        yield
    finally:
        with _SILENCE:
            _silenced["depth"] -= 1
            saved = _silenced["saved"]
            if _silenced["depth"] == 0 and saved is not None:
                _python_stderr_back(_silenced["python"])
                os.dup2(saved, 2)
                os.close(saved)
                _silenced["saved"] = _silenced["python"] = None


def _flush_python_stderr() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


_REAL_STDERR: list[int] = []  # a descriptor of the process's stderr, made once and never closed


def _real_stderr() -> int | None:
    """A descriptor of what descriptor 2 is now (the first time: the process's stderr), kept open for good,
    so that a stand-in stream a thread still holds never writes to a closed or reused descriptor."""
    if not _REAL_STDERR:
        try:
            _REAL_STDERR.append(os.dup(2))
        except OSError:
            return None
    return _REAL_STDERR[0]


def _python_stderr_to(fd: int | None) -> tuple[Any, Any] | None:
    """Point `sys.stderr` at `fd` (the process's stderr) when it writes to descriptor 2 itself (not a
    test's capture or a caller's own stream): (the stream it was, the stand-in), else None."""
    if fd is None:
        return None
    current = sys.stderr
    try:
        if current is None or current.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    stand_in = open(fd, "w", buffering=1, encoding=getattr(current, "encoding", None) or "utf-8",
                    errors=getattr(current, "errors", None) or "backslashreplace", closefd=False)
    sys.stderr = stand_in
    return current, stand_in


def _python_stderr_back(swapped: tuple[Any, Any] | None) -> None:
    if swapped is None:
        return
    current, stand_in = swapped
    try:
        stand_in.flush()
    except (OSError, ValueError):
        pass
    if sys.stderr is stand_in:
        sys.stderr = current  # the stand-in is not closed: a thread may still hold it (its descriptor stays)


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
def _pyav_stream(path: str):
    """(container, its video stream: `_video_stream`) opened with PyAV, closed afterwards; one-line VideoErrors.

    FFmpeg's own log lines (warnings about damaged or oddly seeked streams) are kept off stderr meanwhile.
    """
    import av

    with _native_stderr_silenced():
        try:
            container = av.open(path, **_open_options())
        except pyav_file_errors():  # av.error.* (InvalidDataError, ...), OSError: what the file causes
            raise _unreadable(path) from None
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



def _fraction(value) -> Fraction | None:
    """A PyAV rational as a Fraction, None when unset: PyAV before 19 gives a Fraction or None for
    `time_base` / `average_rate`, PyAV 19 an AVRational that is falsy (0/1) when unset."""
    return Fraction(value.numerator, value.denominator) if value else None



def _header(container, stream) -> Header:
    tb = _fraction(stream.time_base) or Fraction(1, 1)
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
