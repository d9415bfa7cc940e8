"""Decoding with PyAV: the demuxer's packets as an index, seeking to the sampled frames where it is
trusted, else every frame decoded in order (damaged packets skipped; the B-frame time rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator

import numpy as np

from ..interrupt import checkpoint
from .probe import Header, judge_index, pyav_file_errors, pyav_stream
from . import workers as _workers
from .resize import Background
from .timeline import Timeline


@dataclass
class Packets:
    """The video stream's packets as the demuxer lists them (stream ticks), sorted by presentation time."""

    pts: np.ndarray  # int64
    keys: np.ndarray  # pts of key frames
    end: int | None  # the latest pts + duration
    missing: int  # packets with data but no pts
    key_dts: dict = field(default_factory=dict)  # a key frame's pts -> its dts (where the demuxer gives one)
    first_dts: int | None = None  # the lowest dts of any packet



def demux(container: Any, stream: Any) -> Packets:
    """The video stream's packets, every one demuxed (the whole file read, nothing decoded)."""
    pts, keys, end, missing = [], [], None, 0
    key_dts: dict[int, int] = {}
    first_dts = None
    for packet in container.demux(stream):
        checkpoint("reading the video")
        if packet.size == 0:  # flush packets, and the empty placeholders some AVI writers store
            continue
        if packet.pts is None:
            missing += 1
            continue
        pts.append(packet.pts)
        if packet.dts is not None:
            first_dts = packet.dts if first_dts is None else min(first_dts, packet.dts)
        if packet.is_keyframe:
            keys.append(packet.pts)
            if packet.dts is not None:
                key_dts[packet.pts] = packet.dts
        if packet.duration:
            end = packet.pts + packet.duration if end is None else max(end, packet.pts + packet.duration)
    return Packets(np.sort(np.asarray(pts, dtype=np.int64)), np.sort(np.asarray(keys, dtype=np.int64)), end, missing,
                   key_dts, first_dts)



def pyav_timeline(packets: Packets, header: Header) -> Timeline:
    """Frame times from the packets' presentation timestamps, judged against the header (with the key
    frames' indices)."""
    tb = header.time_base
    origin = header.start_pts if header.start_pts is not None else int(packets.pts[0])
    starts = (packets.pts - origin).astype(np.float64) * float(tb)
    duration = span_end(starts, float((packets.end - origin) * tb) if packets.end is not None else None,
                        header.average_fps)
    if packets.missing:
        problem = f"{packets.missing} packets have no timestamp"
    else:
        problem = judge_index(starts, duration, header)
    keys = np.searchsorted(packets.pts, packets.keys)
    keys = np.unique(keys[(keys < len(packets.pts)) & (packets.pts[np.minimum(keys, len(packets.pts) - 1)] == packets.keys)])
    return Timeline(starts=starts, duration=duration, average_fps=header.average_fps, source="pyav index",
                    trusted=not problem, problem=problem, keys=keys, stated=header.stated_length())



def span_end(starts: np.ndarray, end: float | None, average_fps: float) -> float:
    """The last frame's end: `end` where it lies after the last start, else the last start plus one frame gap."""
    if end is not None and math.isfinite(end) and end > starts[-1]:
        return float(end)
    if len(starts) > 1:
        gap = float(np.median(np.diff(starts)))
    else:
        gap = 1.0 / average_fps if average_fps > 0 else 1.0 / 30
    return float(starts[-1] + gap)



def seek_decode(path: str, packets: Packets, wanted_pts: list[int],
                shrink: Callable[[np.ndarray], np.ndarray] | None = None,
                keyframes: bool = False, workers: int | None = None) -> dict[int, np.ndarray] | None:
    """Decode the frames whose pts are `wanted_pts` (each passed through `shrink` as soon as it is
    decoded), in one forward pass where the samples are close and seeking to the key frame before each
    distant one (`_Seeker`). `keyframes`: the wanted frames are key frames; nothing else is decoded.
    `workers`: threads decoding key-frame intervals at once, each with its own container
    (`workers.resolve_workers`; None: one per core, at most 4); the frames are the same however many.

    Returns None when a frame cannot be reached that way, or FFmpeg fails seeking or decoding (a
    damaged file: e.g. a broken codec header makes every packet fail with EINVAL, which is not one of
    the damaged-packet errors `decoded` skips): the caller then decodes every frame in order, which
    keeps what decodes or says in one line why nothing does.
    """
    shrink = shrink or (lambda image: image)
    targets = sorted(set(wanted_pts))
    work = _workers.groups(packets.keys, targets, each=keyframes)
    count = _workers.resolve_workers(workers, len(work))
    key_set = set(packets.keys.tolist())
    wanted = set(targets)

    def decode(mine, stop) -> bool:
        with pyav_stream(path) as (container, stream):
            size = stream_size(stream)
            if keyframes:  # one packet decoded per frame: frame threads would only add latency
                stream.thread_type = "SLICE"
            if count > 1:
                stream.thread_count = _workers.ffmpeg_threads(count)
            seeker = _Seeker(container, stream, packets, wanted, stop)
            try:
                for n, group in enumerate(mine):
                    if n == 0 and _after_first_interval(packets, group[0]):
                        _prime(container, stream)
                    for target in group:
                        checkpoint("decoding the video")
                        if stop.is_set():
                            raise _workers.Stopped()
                        frame = _key_frame(container, stream, packets, target) if keyframes and target in key_set \
                            else seeker.frame_at(target)
                        if frame is None:
                            return False
                        converting.put(target, lambda frame=frame: shrink(rgb(frame, size)))
            except pyav_file_errors():
                return False
        return True

    with Background() as converting:
        if not _workers.run_groups(work, count, decode):
            return None
        return converting.take()



def _after_first_interval(packets: Packets, target: int) -> bool:
    """Whether `target` lies after the stream's second key frame (a seek to it starts decoding there)."""
    return len(packets.keys) > 1 and target >= int(packets.keys[1])


def _prime(container, stream) -> None:
    """Decode the stream's first frame, before a first seek past it. FFmpeg's decoders keep for the whole
    stream what its first packets say: H.264's decoder reads the x264 build from the first frame's SEI
    and works around that build's bugs (a 4:4:4 stream from an x264 older than build 151 decodes green
    without it: tests/data/cockatoo.mp4), MPEG-4's the Xvid or DivX build; a decoder whose first packet
    is a later key frame never sees them. The seek after it flushes the decoder."""
    for _ in decoded(container, stream):
        break


def first_decodes(path: str) -> bool:
    """Whether a frame of the file decodes, reading from its start up to the first that does (cheap: a
    few packets on a sound file); False where FFmpeg fails (a broken codec header fails every packet)."""
    with pyav_stream(path) as (container, stream):
        stream.thread_type = "SLICE"  # one frame is wanted: frame threads would each decode one first
        try:
            return next(decoded(container, stream), None) is not None
        except pyav_file_errors():
            return False


def _key_frame(container, stream, packets: Packets, target: int):
    """The key frame whose pts is `target`, decoded alone: seek to it, read packets (nothing decoded) up to
    its own, decode that one packet and drain the decoder. None where it cannot be reached (a seek that
    lands after it is retried: `_seek_points`)."""
    context = stream.codec_context
    for seek_to in [target, *_seek_points(packets, target, target)]:
        container.seek(int(seek_to), stream=stream, backward=True, any_frame=False)
        found = None
        for packet in container.demux(stream):
            checkpoint("decoding the video")
            if packet.pts is None or not packet.size:
                continue
            if packet.pts == target:
                found = packet
                break
            if packet.is_keyframe and packet.pts > target:  # landed after it
                break
        if found is not None:
            context.flush_buffers()
            frames = list(context.decode(found)) + list(context.decode(None))
            context.flush_buffers()  # out of draining, for the next seek
            return next((f for f in frames if frame_pts(f) == target), None)
    return None


def _seek_points(packets: Packets, target: int, below: int) -> list[int]:
    """Where to seek again after a seek to `below` landed after the frame `target`, in order: the decoding
    time (dts) of the key frame at or before it (demuxers that seek by decoding time, MPEG-TS: a key
    frame's dts lies before its pts, so a seek to its pts lands after it), the key frame before that, and
    the stream's first packet; each before the last, so that every retry goes back."""
    keys = packets.keys
    at = keys[keys <= target]
    points = []
    if len(at) and int(at[-1]) in packets.key_dts:
        points.append(packets.key_dts[int(at[-1])])
    if len(at) > 1:
        points.append(int(at[-2]))
    if packets.first_dts is not None:
        points.append(packets.first_dts)
    out = []
    for point in points:
        if point < below and (not out or point < out[-1]):
            out.append(int(point))
    return out



class _Seeker:
    """Frames by exact pts, decoding forward while no key frame lies between the decoder and the next one.

    After a seek, frames count only from the first key frame decoded on, and a frame is taken only when
    its pts equals the one wanted. A seek that lands after the frame wanted (FFmpeg may seek by decoding
    time, with B-frames a key frame is decoded before frames shown just before it, and MPEG-TS seeks
    land on the next key frame) or past the end is retried (`_seek_points`: the key frame's decoding
    time, the key frame before, the stream's first packet), up to three times.

    Frames nothing refers to are not decoded unless wanted: before each packet the decoder is told to
    skip non-reference frames (`skip_frame` "NONREF") when the packet is not a wanted frame, which
    FFmpeg's H.264, HEVC, MPEG-4 and MPEG-2 decoders honour (others decode everything).
    """

    def __init__(self, container, stream, packets: Packets, wanted: set[int], stop=None):
        self.container, self.stream, self.packets, self.keys = container, stream, packets, packets.keys
        self.wanted = wanted
        self.stop = stop  # a threading.Event another worker sets: raise `workers.Stopped` at the next packet
        self.context = stream.codec_context
        self.mode = None  # the skip_frame set last
        self.frames = None  # the decoding generator, None before the first seek
        self.skipped = [0]  # damaged packets met (pictures may then come out of order)
        self.last = None  # pts of the last frame decoded
        self.started = False
        self.seek_to = 0

    def _skip(self, packet) -> None:
        """Set the decoder's skip_frame for this packet (only when it changes)."""
        if self.stop is not None and self.stop.is_set():
            raise _workers.Stopped()
        mode = "DEFAULT" if packet.pts in self.wanted else "NONREF"
        if mode != self.mode:
            self.context.skip_frame = mode
            self.mode = mode

    def _seek(self, pts: int) -> None:
        self.container.seek(int(pts), stream=self.stream, backward=True, any_frame=False)
        self.frames = decoded(self.container, self.stream, self.skipped, self._skip)
        self.last, self.started, self.seek_to = None, False, pts

    def _far(self, target: int) -> bool:
        """Whether decoding forward to `target` would pass more than one key frame (or the decoder is past
        it, or has not started): then seeking is shorter."""
        if self.frames is None or self.last is None or self.last >= target:
            return True
        after = np.searchsorted(self.keys, self.last, side="right")
        return after < len(self.keys) and self.keys[after] <= target

    def _seek_earlier(self, landed: int, target: int) -> bool:
        """Seek again, before both `landed` and the last seek (`_seek_points`); False when nothing is left."""
        points = _seek_points(self.packets, target, min(landed, self.seek_to))
        if not points:
            return False
        self._seek(points[0])
        return True

    def frame_at(self, target: int):
        """The decoded frame (an av.VideoFrame) whose pts is `target`, None where it cannot be reached."""
        if self._far(target):
            self._seek(target)
        for _ in range(4):  # the seek, and up to three retries from earlier key frames
            for frame in self.frames:
                pts = frame_pts(frame)
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
                    return frame
                if pts > target:  # the frame is not where the index puts it
                    return None
            else:  # the stream ended
                if self.started:
                    return None
                pts = self.seek_to + 1  # landed past the last key frame
            if not self._seek_earlier(pts, target):
                return None
        return None



def frames_by_pts(path: str, shrink: Callable[[np.ndarray], np.ndarray]) -> Generator[np.ndarray | None, int, None]:
    """A generator (started with next()) sent pts in increasing order, repeats allowed, that answers each
    with the frame of that pts (RGB, turned, passed through `shrink`), decoding the file in order from the
    start; None where that pts does not come before a later one, or decoding fails. Seeking's fallback
    (`stream.py`): exact for the frames of a trusted index, whose pts are each a frame's own."""
    import contextlib

    last: tuple = (None, None)
    with pyav_stream(path) as (container, stream):
        size = stream_size(stream)
        frames = decoded(container, stream)
        pts = yield
        while True:
            if last[0] != pts:
                last = (None, None)
                with contextlib.suppress(*pyav_file_errors()):
                    for frame in frames:
                        shown = frame_pts(frame)
                        if shown == pts:
                            last = (pts, shrink(rgb(frame, size)))
                            break
                        if shown is not None and shown > pts:
                            break
            pts = yield last[1]



def rgb(frame: Any, size: tuple[int, int] | None = None) -> np.ndarray:
    """RGB pixels turned the way the container says to show them (its display rotation, as decord does).

    `size` (width, height): the stream's size when opened (`stream_size`); a frame of another size (a
    stream whose resolution changes part way: joined recordings, adaptive-bitrate captures) is scaled
    to it, as decord does, so that every frame of a video has one size."""
    if size is not None and (frame.width, frame.height) != size:
        image = frame.to_ndarray(format="rgb24", width=size[0], height=size[1])
    else:
        image = frame.to_ndarray(format="rgb24")
    turns = int(round(getattr(frame, "rotation", 0) or 0) / 90) % 4  # counter-clockwise quarter turns
    return np.ascontiguousarray(np.rot90(image, turns)) if turns else image



def stream_size(stream: Any) -> tuple[int, int] | None:
    """(width, height) of the video stream as opened (its header, or its first frames), None if unknown."""
    width, height = stream.codec_context.width, stream.codec_context.height
    return (width, height) if width and height else None



def frame_pts(frame: Any) -> int | None:
    """A decoded frame's pts, else its dts (None where it has neither)."""
    return frame.pts if frame.pts is not None else getattr(frame, "dts", None)



def decoded(container: Any, stream: Any, skipped: list[int] | None = None,
            before: Callable[[Any], None] | None = None) -> Iterator[Any]:
    """The stream's frames in decoding order, as `container.decode(stream)` gives them, except that a
    packet the codec refuses (damaged data: a broken download, a bad sector) is skipped, as the ffmpeg
    command line does, instead of ending the decoding: the frames after it still decode (those that
    referred to it may show artefacts), and the frames it held are missing. `skipped[0]` counts them.
    `before(packet)` is called before each packet is decoded (the decoder's settings for it)."""
    import av

    for packet in container.demux(stream):
        checkpoint("decoding the video")
        if before is not None and packet.size:
            before(packet)
        try:
            frames = packet.decode()
        except (av.error.InvalidDataError, av.error.PatchWelcomeError, av.error.UndefinedError):
            if skipped is not None:
                skipped[0] += 1
            continue
        yield from frames
