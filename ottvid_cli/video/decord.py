"""Decoding with decord: its index judged against the header, random access where it gives the right
frames; PyAV takes over (decoder "auto") where decord cannot open a file or cannot be trusted."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..interrupt import checkpoint
from ..checks import DECODERS
from .probe import Header, judge_index, pyav_stream, read_header, unreadable
from .resize import Shrinker
from .timeline import Plan, Timeline, VideoError, error_reason


@functools.lru_cache(maxsize=1)
def decord_available() -> bool:
    """Whether decord can be imported (its wheels exist for Linux and Windows x86-64 only)."""
    try:
        import decord  # noqa: F401
    except Exception:  # ImportError, or a broken native library
        return False
    return True



def resolve_decoder(decoder: str = "auto") -> str:
    """The backend a `decoder` name stands for: "auto" is PyAV (with frames resized as decoded and
    non-reference frames skipped it is faster than decord on long videos, and decord 0.6.0 holds GBs of a
    4K file's frames: docs/video.md, "Speed"); decord only when asked for by name."""
    if decoder not in DECODERS:
        raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    if decoder == "auto":
        return "pyav"
    if decoder == "decord" and not decord_available():
        raise VideoError("decoder 'decord' is not installed (pip install decord; Linux and Windows x86-64 only); "
                         "use decoder 'pyav' or 'auto'")
    return decoder



@functools.lru_cache(maxsize=1)
def _quiet_decord() -> None:
    """Keep decord's own FFmpeg (not PyAV's) from writing log lines to stderr: decord sets it to error level
    when imported, and its decoding threads go on with damaged packets after a call has failed, so the
    level is set to quiet for good, once, before decord first opens a file."""
    import decord

    decord.logging.set_level(decord.logging.QUIET)


def decord_file_errors() -> tuple[type[BaseException], ...]:
    """What decord raises for a file it cannot read: its DECORDError, and RuntimeError, which its
    native layer raises for FFmpeg's failures ("Error reading ..."), and OSError."""
    from decord._ffi.base import DECORDError

    return (DECORDError, RuntimeError, OSError)



def open_decord(path: str) -> Any:
    """decord's VideoReader of the file (decord's logging quieted); one-line VideoErrors where it cannot."""
    import decord

    _quiet_decord()
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=0)
    except decord_file_errors() as exc:
        if "video stream" in str(exc):
            raise VideoError(f"video has no frames: {path} (no decodable video stream)") from None
        raise unreadable(path) from None
    if len(reader) == 0:
        raise VideoError(f"video has no frames: {path}")
    return reader



def decord_seeks_right(header: Header) -> bool:
    """Whether decord 0.6.0's random access returns the right frames for this kind of file.

    Measured on numbered test files (tests/test_video.py): right wherever frames are not reordered,
    and for H.264 with B-frames in MP4/MOV or Matroska; wrong (other frames' pixels under valid-looking
    timestamps) for B-frames of MPEG-4 Part 2, MPEG-2 and HEVC in any container, and for H.264 with
    B-frames in MPEG-TS.
    """
    return not header.reordered or (header.codec == "h264" and header.format.split(",")[0] in ("mov", "matroska"))



def read_timeline(reader, header: Header) -> Timeline:
    """Frame times from decord's index (`reader`: a decord.VideoReader), judged against the header."""
    count = len(reader)
    try:
        stamps = np.asarray(reader.get_frame_timestamp(range(count)), dtype=np.float64).reshape(count, 2)
    except decord_file_errors():
        stamps = np.full((count, 2), np.nan)
    starts, end = stamps[:, 0], float(stamps[-1, 1])
    problem = judge_index(starts, end, header)
    if not problem and not decord_seeks_right(header):
        problem = f"decord seeks to wrong frames in {header.codec} with B-frames in {header.format.split(',')[0]}"
    return Timeline(starts=starts, duration=end, average_fps=float(reader.get_avg_fps() or header.average_fps),
                    source="decord index", trusted=not problem, problem=problem,
                    stated=header.stated_length())  # (key frames: PyAV's index)



def trusted_reader(path: str) -> tuple[Any, Timeline]:
    """(decord's reader of the file, its timeline); one-line VideoErrors where decord cannot open the file
    or cannot be trusted with its index."""
    with pyav_stream(path) as (container, stream):
        header = read_header(container, stream)
    reader = open_decord(path)
    timeline = read_timeline(reader, header)
    if not timeline.trusted:
        raise VideoError(f"decord cannot be trusted on {path} ({timeline.problem}); use decoder 'pyav' or 'auto'")
    return reader, timeline



DECORD_CHUNK = 8  # frames decord hands over at once (each at full size until shrunk)


def sample_decord(path: str, plan: Plan, shrink: Shrinker) -> tuple[Timeline, list[int], np.ndarray]:
    """Sample with decord, asked for by name: a file it cannot open, an index it cannot be trusted with, or
    frames that are not RGB are one-line VideoErrors (never handed to PyAV silently)."""
    reader, timeline = trusted_reader(path)
    indices = plan(timeline)
    shrink.restart(len(indices))
    frames, problem = [], ""
    try:
        if indices and indices[0] > 0:  # the first frame first, as PyAV's seeking does (`pyav._prime`)
            reader.get_batch([0])
        for at in range(0, len(indices), DECORD_CHUNK):  # a few full-size frames at a time, shrunk at once
            checkpoint("decoding the video")
            chunk = reader.get_batch(indices[at:at + DECORD_CHUNK]).asnumpy()
            if not (chunk.ndim == 4 and chunk.shape[-1] == 3):
                problem = f"frames of shape {chunk.shape[1:]}, not RGB"
                break
            frames.extend(shrink(image) for image in chunk)
    except decord_file_errors() as exc:
        problem = error_reason(exc)
    if problem:  # e.g. decord 0.6.0 on a file shown turned by a quarter turn (PyAV decodes it)
        raise VideoError(f"decord cannot decode frames of {path}: {problem}")
    return timeline, indices, np.stack(frames)
