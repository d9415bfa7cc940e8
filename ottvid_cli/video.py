"""Video decoding: true per-frame timestamps, uniform-in-time sampling, two backends (decord, PyAV).

Two sampling plans: `sample_frames(path, 32)` (question answering: a fixed, even number of frames)
and `sample_fps(path, 2.0, max_frames)` (grounding: a fixed rate). Both sample uniformly in *time*
over the video's duration, using each frame's real timestamp, so variable-frame-rate files and
files whose average fps is wrong still give correct times.

Random access (decord's index, or PyAV seeking) is used only where the container's index is judged
trustworthy; otherwise every frame is decoded in order with PyAV and only the sampled ones are kept.
The rules are written out in docs/video.md.

A folder of frame images (MVBench's episodic_reasoning stores its clips so) is a video too: its
images in natural order of their names, frame i shown from i / frame_rate s (default 3 fps), sampled
by the same plans; only the sampled images are read (Pillow).
"""

from __future__ import annotations

import functools
import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterator

import numpy as np

from .settings import DECODERS, DEFAULT_MAX_FRAMES, SAMPLING_RULES as RULES



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


@dataclass
class Video:
    """Sampled frames of one video file.

    frames: (n, H, W, 3) uint8 RGB; timestamps: start time of each sampled frame (s, from the stream's
    start); indices: their frame numbers in the file (presentation order); duration: the whole video's
    length (s); decoder: the backend that produced the frames ("decord" or "pyav").
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

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the sample over the video's duration."""
        return len(self.indices) / self.duration if self.duration > 0 else float(len(self.indices))


# --------------------------------------------------------------------------- choosing a backend


@functools.lru_cache(maxsize=1)
def decord_available() -> bool:
    """Whether decord can be imported (its wheels exist for Linux and Windows x86-64 only)."""
    try:
        import decord  # noqa: F401
    except Exception:  # ImportError, or a broken native library
        return False
    return True


def resolve_decoder(decoder: str = "auto") -> str:
    """The backend a `decoder` name stands for: "auto" is decord when it can be imported, else PyAV."""
    if decoder not in DECODERS:
        raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    if decoder == "auto":
        return "decord" if decord_available() else "pyav"
    if decoder == "decord" and not decord_available():
        raise VideoError("decoder 'decord' is not installed (pip install decord; Linux and Windows x86-64 only); "
                         "use decoder 'pyav' or 'auto'")
    return decoder


# --------------------------------------------------------------------------- opening files


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


def decord_file_errors() -> tuple[type[BaseException], ...]:
    """What decord raises for a file it cannot read: its DECORDError, and RuntimeError, which its
    native layer raises for FFmpeg's failures ("Error reading ..."), and OSError."""
    from decord._ffi.base import DECORDError

    return (DECORDError, RuntimeError, OSError)


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


def _open_decord(path: str):
    import decord

    try:
        with _native_stderr_silenced():  # FFmpeg/decord log their own lines for unreadable files
            reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=0)
    except decord_file_errors() as exc:
        if "video stream" in str(exc):
            raise VideoError(f"video has no frames: {path} (no decodable video stream)") from None
        raise _unreadable(path) from None
    if len(reader) == 0:
        raise VideoError(f"video has no frames: {path}")
    return reader


# --------------------------------------------------------------------------- what the container says


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


# --------------------------------------------------------------------------- indices (no decoding)


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
                    source="decord index", trusted=not problem, problem=problem)


@dataclass
class _Packets:
    """The video stream's packets as the demuxer lists them (stream ticks), sorted by presentation time."""

    pts: np.ndarray  # int64
    keys: np.ndarray  # pts of key frames
    end: int | None  # the latest pts + duration
    missing: int  # packets with data but no pts


def _demux(container, stream) -> _Packets:
    pts, keys, end, missing = [], [], None, 0
    for packet in container.demux(stream):
        if packet.size == 0:  # flush packets, and the empty placeholders some AVI writers store
            continue
        if packet.pts is None:
            missing += 1
            continue
        pts.append(packet.pts)
        if packet.is_keyframe:
            keys.append(packet.pts)
        if packet.duration:
            end = packet.pts + packet.duration if end is None else max(end, packet.pts + packet.duration)
    return _Packets(np.sort(np.asarray(pts, dtype=np.int64)), np.sort(np.asarray(keys, dtype=np.int64)), end, missing)


def _pyav_timeline(packets: _Packets, header: Header) -> Timeline:
    """Frame times from the packets' presentation timestamps, judged against the header."""
    tb = header.time_base
    origin = header.start_pts if header.start_pts is not None else int(packets.pts[0])
    starts = (packets.pts - origin).astype(np.float64) * float(tb)
    duration = _span_end(starts, float((packets.end - origin) * tb) if packets.end is not None else None,
                         header.average_fps)
    if packets.missing:
        problem = f"{packets.missing} packets have no timestamp"
    else:
        problem = judge_index(starts, duration, header)
    return Timeline(starts=starts, duration=duration, average_fps=header.average_fps, source="pyav index",
                    trusted=not problem, problem=problem)


def _span_end(starts, end: float | None, average_fps: float) -> float:
    """The last frame's end: `end` where it lies after the last start, else the last start plus one frame gap."""
    if end is not None and math.isfinite(end) and end > starts[-1]:
        return float(end)
    if len(starts) > 1:
        gap = float(np.median(np.diff(starts)))
    else:
        gap = 1.0 / average_fps if average_fps > 0 else 1.0 / 30
    return float(starts[-1] + gap)


# --------------------------------------------------------------------------- sampling plans


def _frames_at(timeline: Timeline, count: int) -> list[int]:
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
    return _frames_at(timeline, count) if rule == "centre" else _frames_linspace(timeline, count, rule)


def _even(n: int) -> int:
    """Largest even number <= n, at least 2 (Qwen2.5-VL encodes frames in pairs)."""
    return max(2, n - n % 2)


Plan = Callable[[Timeline], "list[int]"]
HARNESS_MIN_FRAMES = 4  # qwen-vl-utils FPS_MIN_FRAMES: the fewest frames its fps sampling takes


def harness_frames(total: int, average_fps: float, duration: float, fps: float) -> float:
    """The frames qwen-vl-utils' `smart_nframes` wants at `fps`, before its bounds (at least
    `HARNESS_MIN_FRAMES`, at most the cap and the frame count, made even): frames / average fps x fps."""
    return total / average_fps * fps if average_fps > 0 else duration * fps


def _plan_count(num_frames: int, rule: str = "centre") -> Plan:
    return lambda timeline: _pick(timeline, _even(min(num_frames, len(timeline.starts))), rule)


def _plan_rate(fps: float, max_frames: int | None, rule: str = "centre") -> Plan:
    def plan(timeline: Timeline) -> list[int]:
        total = len(timeline.starts)
        if rule != "centre":  # qwen-vl-utils smart_nframes: frames / average fps * fps, in [4, cap], even
            cap = min(max_frames or DEFAULT_MAX_FRAMES, total)
            wanted = harness_frames(total, timeline.average_fps, timeline.duration, fps)
            return _pick(timeline, _even(int(min(max(wanted, HARNESS_MIN_FRAMES), cap))), rule)
        count = int(math.floor(timeline.duration * fps + 1e-9))
        if max_frames is not None:
            count = min(count, max_frames)
        return _pick(timeline, _even(min(count, total) if total >= 2 else count), rule)

    return plan


# --------------------------------------------------------------------------- decoding with PyAV


def _rgb(frame, size: tuple[int, int] | None = None) -> np.ndarray:
    """RGB pixels turned the way the container says to show them (its display rotation, as decord does).

    `size` (width, height): the stream's size when opened (`_stream_size`); a frame of another size (a
    stream whose resolution changes part way: joined recordings, adaptive-bitrate captures) is scaled
    to it, as decord does, so that every frame of a video has one size."""
    if size is not None and (frame.width, frame.height) != size:
        image = frame.to_ndarray(format="rgb24", width=size[0], height=size[1])
    else:
        image = frame.to_ndarray(format="rgb24")
    turns = int(round(getattr(frame, "rotation", 0) or 0) / 90) % 4  # counter-clockwise quarter turns
    return np.ascontiguousarray(np.rot90(image, turns)) if turns else image


def _stream_size(stream) -> tuple[int, int] | None:
    """(width, height) of the video stream as opened (its header, or its first frames), None if unknown."""
    width, height = stream.codec_context.width, stream.codec_context.height
    return (width, height) if width and height else None


def _frame_pts(frame):
    return frame.pts if frame.pts is not None else getattr(frame, "dts", None)


def _decoded(container, stream, skipped: list[int] | None = None) -> Iterator[Any]:
    """The stream's frames in decoding order, as `container.decode(stream)` gives them, except that a
    packet the codec refuses (damaged data: a broken download, a bad sector) is skipped, as the ffmpeg
    command line does, instead of ending the decoding: the frames after it still decode (those that
    referred to it may show artefacts), and the frames it held are missing. `skipped[0]` counts them."""
    import av

    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except (av.error.InvalidDataError, av.error.PatchWelcomeError, av.error.UndefinedError):
            if skipped is not None:
                skipped[0] += 1
            continue
        yield from frames


def _seek_decode(path: str, packets: _Packets, wanted_pts: list[int]) -> dict[int, np.ndarray] | None:
    """Decode the frames whose pts are `wanted_pts`, seeking to the key frame before each distant one.

    Returns None when a frame cannot be reached that way, or FFmpeg fails seeking or decoding (a
    damaged file: e.g. a broken codec header makes every packet fail with EINVAL, which is not one of
    the damaged-packet errors `_decoded` skips): the caller then decodes every frame in order, which
    keeps what decodes or says in one line why nothing does.
    """
    got: dict[int, np.ndarray] = {}
    with _pyav_stream(path) as (container, stream):
        seeker = _Seeker(container, stream, packets.keys)
        try:
            for target in sorted(set(wanted_pts)):
                image = seeker.frame_at(target)
                if image is None:
                    return None
                got[target] = image
        except pyav_file_errors():
            return None
    return got


class _Seeker:
    """Frames by exact pts, decoding forward while that is shorter than seeking.

    After a seek, frames count only from the first key frame decoded on, and a frame is taken only when
    its pts equals the one wanted. A seek that lands after the frame wanted (FFmpeg may seek by decoding
    time, with B-frames a key frame is decoded before frames shown just before it, and MPEG-TS seeks
    land on the next key frame) or past the end is retried from the key frame before, up to three times.
    """

    def __init__(self, container, stream, keys: np.ndarray):
        self.container, self.stream, self.keys = container, stream, keys
        self.size = _stream_size(stream)
        self.frames = None  # the decoding generator, None before the first seek
        self.skipped = [0]  # damaged packets met (pictures may then come out of order)
        self.last = None  # pts of the last frame decoded
        self.started = False
        self.seek_to = 0

    def _seek(self, pts: int) -> None:
        self.container.seek(int(pts), stream=self.stream, backward=True, any_frame=False)
        self.frames = _decoded(self.container, self.stream, self.skipped)
        self.last, self.started, self.seek_to = None, False, pts

    def _far(self, target: int) -> bool:
        """Whether a key frame lies between the decoder's position and `target` (or it is past `target`)."""
        if self.frames is None or self.last is None or self.last >= target:
            return True
        after = np.searchsorted(self.keys, self.last, side="right")
        return after < len(self.keys) and self.keys[after] <= target

    def _seek_earlier(self, landed: int) -> bool:
        """Seek to the key frame before both `landed` and the last seek; False when none is left to try."""
        earlier = self.keys[self.keys < min(landed, self.seek_to)]
        if not len(earlier):
            return False
        self._seek(int(earlier[-1]))
        return True

    def frame_at(self, target: int) -> np.ndarray | None:
        if self._far(target):
            self._seek(target)
        for _ in range(4):  # the seek, and up to three retries from earlier key frames
            for frame in self.frames:
                pts = _frame_pts(frame)
                if pts is None or self.skipped[0]:  # damaged data: `_decode_all` decodes in order instead
                    return None
                if not self.started:
                    if not frame.key_frame:
                        continue
                    self.started = True
                    if pts > target:  # landed after the frame wanted
                        break
                self.last = pts
                if pts == target:
                    return _rgb(frame, self.size)
                if pts > target:  # the frame is not where the index puts it
                    return None
            else:  # the stream ended
                if self.started:
                    return None
                pts = self.seek_to + 1  # landed past the last key frame
            if not self._seek_earlier(pts):
                return None
        return None


def _decode_all(path: str, keep: set[int], skipped: list[int] | None = None
                ) -> tuple[np.ndarray, float, dict[int, np.ndarray], float]:
    """Decode every frame in order: (start times from the stream's start, the last frame's end, the kept
    frames by index, average fps). A frame without a usable pts (none, or not after the previous one) is
    given the previous time plus one frame gap. Damaged packets are skipped (counted in `skipped[0]`);
    after one, the pictures the decoder puts out of order (B-frames whose references were lost) are
    dropped, so that every later frame keeps its own time.

    The decoder hands frames out in the order they are shown. Where their pts still go backwards in
    that order while their dts strictly increase (an AVI, which stores no presentation times, with
    DivX-style packed B-frames: the demuxer's guessed pts are a frame or two off, issue 23), each
    frame's time is its own dts instead, from the first frame's, as FFmpeg's best-effort timestamp
    prefers the dts when the pts are the faultier; either way a frame's time and pixels come from the
    same decoded frame."""
    times: list[float] = []
    dts: list[int | None] = []  # each kept-in-order frame's dts
    backwards = False  # some frame's pts was not after the previous frame's
    kept: dict[int, np.ndarray] = {}
    end = None
    if skipped is None:
        skipped = [0]
    with _pyav_stream(path) as (container, stream):
        header = _header(container, stream)
        tb = float(header.time_base)
        gap = 1.0 / header.average_fps if header.average_fps > 0 else 1.0 / 30
        origin = header.start_pts
        size = _stream_size(stream)
        try:
            i = -1
            for frame in _decoded(container, stream, skipped):
                pts = _frame_pts(frame)
                if origin is None and pts is not None:
                    origin = pts
                t = (pts - origin) * tb if pts is not None else None
                if t is not None and times and t <= times[-1] and skipped[0]:
                    continue  # a picture that damaged data put out of order (its references are lost): dropped
                i += 1
                if t is not None and times and t <= times[-1]:
                    backwards = True
                if t is None or (times and t <= times[-1]):
                    t = times[-1] + gap if times else 0.0
                times.append(t)
                dts.append(getattr(frame, "dts", None))
                duration = getattr(frame, "duration", None)
                end = t + duration * tb if duration else None
                if i in keep:
                    kept[i] = _rgb(frame, size)
        except pyav_file_errors() as exc:
            if not times:
                raise VideoError(f"cannot decode frames of {path}: {_reason(exc)}") from None
            # a damaged tail: keep what decoded
    if not times:
        raise VideoError(f"video has no frames: {path} (nothing decodes)")
    if backwards and (starts := _dts_times(dts, tb, gap)) is not None:  # the pts were wrong: each frame's dts
        return starts, _span_end(starts, None, header.average_fps), kept, header.average_fps
    starts = np.asarray(times)
    return starts, _span_end(starts, end, header.average_fps), kept, header.average_fps


def _dts_times(dts: list[int | None], tb: float, gap: float) -> np.ndarray | None:
    """Frame times (s) from the frames' dts, from the first frame's; a frame without one (the last,
    flushed from the decoder) one gap after the previous. None when the first frame has none or the
    known ones do not strictly increase."""
    known = [d for d in dts if d is not None]
    if not dts or dts[0] is None or any(b <= a for a, b in zip(known, known[1:])):
        return None
    times = []
    for d in dts:
        times.append((d - dts[0]) * tb if d is not None else times[-1] + gap)
    if any(b <= a for a, b in zip(times, times[1:])):
        return None
    return np.asarray(times, dtype=np.float64)


def _sequential(path: str, plan: Plan, guess: Timeline | None, problem: str) -> tuple[Timeline, list[int], np.ndarray]:
    """Decode every frame in order, keeping only the sampled ones (memory: the sample plus one frame).

    The frames to keep are first chosen on `guess` (an index's times); if the decoded times choose
    others, a second pass keeps those.
    """
    first = set(plan(guess)) if guess is not None else set()
    skipped = [0]
    starts, end, kept, fps = _decode_all(path, first, skipped)
    if skipped[0]:
        problem = f"{problem}; {skipped[0]} damaged packets skipped (their frames are missing)"
    timeline = Timeline(starts=starts, duration=end, average_fps=fps, source="decoded frames", trusted=False,
                        problem=problem)
    indices = plan(timeline)
    if not set(indices) <= kept.keys():
        _, _, kept, _ = _decode_all(path, set(indices))
    return timeline, indices, np.stack([kept[i] for i in indices])


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:120]


# --------------------------------------------------------------------------- folders of frame images

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
DEFAULT_FRAME_RATE = 3.0  # frames a second of a folder of frame images: MVBench's (tvqa frames_fps3_hq)


def _frame_rate(rate: float | None) -> float:
    rate = DEFAULT_FRAME_RATE if rate is None else rate
    if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
        raise VideoError(f"the frame rate of a folder of frames must be > 0, got {rate}")
    return float(rate)


def _natural(name: str) -> list:
    """Sort key putting frame_2 before frame_10: runs of digits compare as numbers."""
    return [int(part) if i % 2 else part.lower() for i, part in enumerate(re.split(r"(\d+)", name))]


def frame_files(folder: str | os.PathLike) -> list[str]:
    """The frame images of a folder (.jpg, .jpeg, .png, .webp, any case; hidden files and subfolders
    left out) in natural order of their names; VideoError when there are none."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise VideoError(f"folder of frames not found: {folder}")
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise VideoError(f"cannot list the folder of frames {folder}: {exc.strerror or exc}") from None
    names = [e.name for e in entries if not e.name.startswith(".") and e.name.lower().endswith(IMAGE_SUFFIXES)
             and e.is_file()]
    if not names:
        raise VideoError(f"no frame images ({', '.join(IMAGE_SUFFIXES)}) in the folder {folder}")
    return [os.path.join(folder, name) for name in sorted(names, key=lambda n: (_natural(n), n))]


def _read_image(path: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB of one frame image, turned as its EXIF orientation says (as a viewer shows it).

    16-bit grey images (PNG depth or thermal frames; Pillow's modes "I;16..." and "I") keep their
    high byte, as FFmpeg turns gray16 video into RGB: Pillow's own convert("RGB") clips them at 255,
    which makes nearly every pixel white."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            if image.mode == "I" or image.mode.startswith("I;16"):
                grey = (np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8)
                return np.repeat(grey[:, :, None], 3, axis=2)
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # what Pillow raises for a bad or oversized file (SyntaxError: a broken PNG, ValueError: a bad tile);
        # anything else (TypeError, AttributeError, ...) is a bug and propagates
        reason = "not an image Pillow can read" if isinstance(exc, UnidentifiedImageError) else _reason(exc)
        raise VideoError(f"cannot read frame image {path}: {reason}") from None


def images_timeline(count: int, rate: float) -> Timeline:
    """Frame i of a folder is shown from i / rate s; the folder lasts count / rate s."""
    return Timeline(starts=np.arange(count, dtype=np.float64) / rate, duration=count / rate, average_fps=rate,
                    source="frame images", trusted=True)


def _sample_images(folder: str, plan: Plan, rate: float) -> tuple[Timeline, list[int], np.ndarray]:
    """Sample a folder of frame images by `plan` on their times (i / rate); only the sampled images are
    read. They must all have one size: resizing some would change their aspect silently."""
    files = frame_files(folder)
    timeline = images_timeline(len(files), rate)
    indices = plan(timeline)
    images: dict[int, np.ndarray] = {}
    for i in indices:
        if i not in images:
            images[i] = _read_image(files[i])
    first = indices[0]
    for i in indices:
        if images[i].shape != images[first].shape:
            (h0, w0), (h, w) = images[first].shape[:2], images[i].shape[:2]
            raise VideoError(f"frame images differ in size: {os.path.basename(files[first])} is {w0}x{h0}, "
                             f"{os.path.basename(files[i])} is {w}x{h} (in {folder})")
    return timeline, indices, np.stack([images[i] for i in indices])


# --------------------------------------------------------------------------- the two backends


def _sample_pyav(path: str, plan: Plan, distrust: str = "") -> tuple[Timeline, list[int], np.ndarray]:
    """Seek to the sampled frames where PyAV's index is trusted (and `distrust` gives no reason not to),
    else decode every frame in order."""
    with _pyav_stream(path) as (container, stream):
        header = _header(container, stream)
        packets = _demux(container, stream)
    if len(packets.pts) == 0:
        return _sequential(path, plan, None, distrust or "the demuxer lists no timestamped frames")
    timeline = _pyav_timeline(packets, header)
    problem = distrust or timeline.problem
    if not problem and header.reordered and header.format.split(",")[0] == "avi":
        problem = "AVI stores no presentation times: with B-frames the demuxer guesses them"
    if not problem:
        indices = plan(timeline)
        wanted = [int(packets.pts[i]) for i in indices]
        got = _seek_decode(path, packets, wanted)
        if got is not None:
            return timeline, indices, np.stack([got[p] for p in wanted])
        problem = "seeking did not reach the frames the index lists"
    starts = timeline.starts
    usable = bool(np.all(np.isfinite(starts)) and np.all(np.diff(starts) > 0))
    return _sequential(path, plan, timeline if usable else None, problem)


def _sample_decord(path: str, plan: Plan, fallback: bool) -> tuple[Timeline, list[int], np.ndarray]:
    with _pyav_stream(path) as (container, stream):
        header = _header(container, stream)
    try:
        reader = _open_decord(path)
    except VideoError:  # PyAV read the header: FFmpeg can read the file, decord cannot
        if not fallback:
            raise
        return _sample_pyav(path, plan, distrust="decord cannot open it")
    timeline = read_timeline(reader, header)
    if not timeline.trusted:
        if not fallback:
            raise VideoError(f"decord cannot be trusted on {path} ({timeline.problem}); use decoder 'pyav' or 'auto'")
        return _sample_pyav(path, plan, distrust=f"decord's index: {timeline.problem}")
    indices = plan(timeline)
    try:
        with _native_stderr_silenced():
            frames = reader.get_batch(indices).asnumpy()
        problem = "" if frames.ndim == 4 and frames.shape[-1] == 3 else f"frames of shape {frames.shape[1:]}, not RGB"
    except decord_file_errors() as exc:
        problem = _reason(exc)
    if problem:  # e.g. decord 0.6.0 on a file shown turned by a quarter turn: PyAV decodes it
        if not fallback:
            raise VideoError(f"decord cannot decode frames of {path}: {problem}")
        return _sample_pyav(path, plan)
    return timeline, indices, frames


def _segment(timeline: Timeline, start: float | None, end: float | None) -> tuple[int, int, float, float]:
    """The frames shown in [start, end] s (first, last + 1) and the part's start and length (s)."""
    lo = max(0.0, start or 0.0)
    hi = timeline.duration if end is None else min(float(end), timeline.duration)
    if not hi > lo:
        raise VideoError(f"the part [{start}, {end}] s is not within the video ({timeline.duration:.2f} s)")
    first = max(int(np.searchsorted(timeline.starts, lo, side="right")) - 1, 0)
    last = max(int(np.searchsorted(timeline.starts, hi, side="left")), first + 1)
    return first, last, lo, hi - lo


def _within(plan: Plan, start: float | None, end: float | None) -> Plan:
    """`plan` applied to the frames shown in [start, end] s only (indices stay the file's)."""
    if start is None and end is None:
        return plan

    def bounded(timeline: Timeline) -> list[int]:
        first, last, lo, length = _segment(timeline, start, end)
        part = Timeline(starts=timeline.starts[first:last] - lo, duration=length, average_fps=timeline.average_fps,
                        source=timeline.source, trusted=timeline.trusted, problem=timeline.problem)
        return [first + i for i in plan(part)]

    return bounded


def _sample(path: str | os.PathLike, plan: Plan, decoder: str, start: float | None = None,
            end: float | None = None, frame_rate: float | None = None) -> Video:
    """Sample the file (or folder of frame images, at `frame_rate`) by `plan`; with `start` / `end`
    (s), only that part of it, which the Video then describes (timestamps from `start`, its length,
    its frame count)."""
    if decoder not in DECODERS:
        raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    if os.path.isdir(path):  # a folder of frame images: Pillow reads them, the decoder does not apply
        path = os.fspath(path)
        plan = _within(plan, start, end)
        timeline, indices, frames = _sample_images(path, plan, _frame_rate(frame_rate))
        backend = "images"
    else:
        backend = resolve_decoder(decoder)
        path = _checked_path(path)
        plan = _within(plan, start, end)
        if backend == "decord":
            timeline, indices, frames = _sample_decord(path, plan, fallback=decoder == "auto")
        else:
            timeline, indices, frames = _sample_pyav(path, plan)
        backend = "decord" if timeline.source == "decord index" else "pyav"
    first, last, lo, duration = (0, len(timeline.starts), 0.0, timeline.duration) if start is None and end is None \
        else _segment(timeline, start, end)
    return Video(
        path=path,
        frames=frames,
        timestamps=[max(0.0, float(timeline.starts[i]) - lo) for i in indices],
        indices=indices,
        duration=duration,
        total_frames=last - first,
        average_fps=timeline.average_fps,
        timeline=timeline,
        decoder=backend,
    )


# --------------------------------------------------------------------------- public entry points


def check_video(path: str | os.PathLike, decoder: str = "auto") -> None:
    """Raise VideoError if the file is missing, unreadable or has no video frame that decodes (cheap:
    the first frame is decoded).

    PyAV reads the header and decodes up to the first frame (damaged packets skipped, as decoding
    does): a file whose frames cannot be decoded (cut off after its header, a broken codec header, a
    codec FFmpeg opens but cannot decode) is refused here, before a model is loaded, not after.
    Decoder "decord" also has decord open the file ("auto" does not need to: PyAV takes over where
    decord cannot open a file). A folder must hold frame images, the first of which must read.
    """
    if os.path.isdir(path):
        if decoder not in DECODERS:
            raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
        _read_image(frame_files(path)[0])
        return
    resolve_decoder(decoder)
    path = _checked_path(path)
    skipped = [0]
    with _pyav_stream(path) as (container, stream):
        stream.thread_type = "SLICE"  # one frame is wanted: frame threads would each decode one first
        try:
            decodes = next(_decoded(container, stream, skipped), None) is not None
        except pyav_file_errors():
            raise _unreadable(path) from None
    if not decodes:
        why = f"{skipped[0]} damaged packets, nothing decodes" if skipped[0] else "nothing decodes"
        raise VideoError(f"video has no frames: {path} ({why})")
    if decoder == "decord":
        _open_decord(path)


def video_duration(path: str | os.PathLike) -> float | None:
    """The video file's length in seconds (its last frame's end) as its container's index lists the
    frames, nothing decoded; None when the demuxer lists no frame with a time. VideoError when the file
    cannot be opened."""
    path = _checked_path(path)
    with _pyav_stream(path) as (container, stream):
        header = _header(container, stream)
        packets = _demux(container, stream)
    return _pyav_timeline(packets, header).duration if len(packets.pts) else None


def sample_frames(path: str | os.PathLike, num_frames: int = 32, decoder: str = "auto",
                  start: float | None = None, end: float | None = None, frame_rate: float | None = None,
                  rule: str = "centre") -> Video:
    """`num_frames` frames (made even; fewer for videos with fewer frames) uniformly in time; with
    `start` / `end` (s), uniformly over that part only (MVBench's time-bounded questions). `path` may
    be a folder of frame images shown at `frame_rate` a second (default `DEFAULT_FRAME_RATE`, 3).
    `rule`: "centre" (the frame shown at each segment's centre) or an evaluation harness's
    "linspace" / "linspace-floor" (`_frames_linspace`)."""
    if num_frames < 1:
        raise VideoError(f"the number of frames must be >= 1, got {num_frames}")
    return _sample(path, _plan_count(num_frames, _rule(rule)), decoder, start, end, frame_rate)


def sample_fps(path: str | os.PathLike, fps: float = 2.0, max_frames: int | None = None,
               decoder: str = "auto", start: float | None = None, end: float | None = None,
               frame_rate: float | None = None, rule: str = "centre") -> Video:
    """Frames at `fps` per second of duration (an even count, at least 2), uniformly in time.

    With `max_frames`, longer videos are subsampled uniformly to that many frames (made even). `path`
    may be a folder of frame images shown at `frame_rate` a second (see `sample_frames`). With a
    harness `rule` ("linspace" / "linspace-floor") the count is qwen-vl-utils' `smart_nframes`
    (frames / average fps x fps, at least 4, at most `max_frames` (768 by default) and the frame
    count, made even) and the frames are spread over the indices as that rule does.
    """
    if not (fps > 0 and math.isfinite(fps)):
        raise VideoError(f"fps must be > 0, got {fps}")
    if max_frames is not None and max_frames < 2:
        raise VideoError(f"max_frames must be >= 2, got {max_frames}")
    return _sample(path, _plan_rate(fps, max_frames, _rule(rule)), decoder, start, end, frame_rate)


def _rule(rule: str) -> str:
    if rule not in RULES:
        raise VideoError(f"unknown sampling rule {rule!r}: choose one of {', '.join(RULES)}")
    return rule
