"""Decoding with PyAV: the demuxer's packets as an index, seeking to the sampled frames where it is
trusted, else every frame decoded in order (damaged packets skipped; the B-frame time rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..interrupt import checkpoint
from .probe import Header, _header, _pyav_stream, judge_index, pyav_file_errors
from .resize import Background, Shrinker
from .timeline import Plan, Timeline, VideoError, _reason


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
        checkpoint("reading the video")
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
    """Frame times from the packets' presentation timestamps, judged against the header (with the key
    frames' indices)."""
    tb = header.time_base
    origin = header.start_pts if header.start_pts is not None else int(packets.pts[0])
    starts = (packets.pts - origin).astype(np.float64) * float(tb)
    duration = _span_end(starts, float((packets.end - origin) * tb) if packets.end is not None else None,
                         header.average_fps)
    if packets.missing:
        problem = f"{packets.missing} packets have no timestamp"
    else:
        problem = judge_index(starts, duration, header)
    keys = np.searchsorted(packets.pts, packets.keys)
    keys = np.unique(keys[(keys < len(packets.pts)) & (packets.pts[np.minimum(keys, len(packets.pts) - 1)] == packets.keys)])
    return Timeline(starts=starts, duration=duration, average_fps=header.average_fps, source="pyav index",
                    trusted=not problem, problem=problem, keys=keys)



def _span_end(starts, end: float | None, average_fps: float) -> float:
    """The last frame's end: `end` where it lies after the last start, else the last start plus one frame gap."""
    if end is not None and math.isfinite(end) and end > starts[-1]:
        return float(end)
    if len(starts) > 1:
        gap = float(np.median(np.diff(starts)))
    else:
        gap = 1.0 / average_fps if average_fps > 0 else 1.0 / 30
    return float(starts[-1] + gap)



def _seek_decode(path: str, packets: _Packets, wanted_pts: list[int],
                 shrink: Callable[[np.ndarray], np.ndarray] | None = None,
                 keyframes: bool = False) -> dict[int, np.ndarray] | None:
    """Decode the frames whose pts are `wanted_pts` (each passed through `shrink` as soon as it is
    decoded), in one forward pass where the samples are close and seeking to the key frame before each
    distant one (`_Seeker`). `keyframes`: the wanted frames are key frames; nothing else is decoded.

    Returns None when a frame cannot be reached that way, or FFmpeg fails seeking or decoding (a
    damaged file: e.g. a broken codec header makes every packet fail with EINVAL, which is not one of
    the damaged-packet errors `_decoded` skips): the caller then decodes every frame in order, which
    keeps what decodes or says in one line why nothing does.
    """
    shrink = shrink or (lambda image: image)
    targets = sorted(set(wanted_pts))
    with _pyav_stream(path) as (container, stream), Background() as converting:
        size = _stream_size(stream)
        if keyframes:  # one packet decoded per frame: frame threads would only add latency
            stream.thread_type = "SLICE"
        seeker = _Seeker(container, stream, packets.keys, set(targets))
        try:
            for target in targets:
                checkpoint("decoding the video")
                frame = _key_frame(container, stream, packets.keys, target) if keyframes else seeker.frame_at(target)
                if frame is None:
                    return None
                converting.put(target, lambda frame=frame: shrink(_rgb(frame, size)))
        except pyav_file_errors():
            return None
        return converting.take()



def _key_frame(container, stream, keys: np.ndarray, target: int):
    """The key frame whose pts is `target`, decoded alone: seek to it, read packets (nothing decoded) up to
    its own, decode that one packet and drain the decoder. None where it cannot be reached (a seek that
    lands after it is retried from the key frame before, up to three times)."""
    context = stream.codec_context
    seek_to = target
    for _ in range(4):
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
            return next((f for f in frames if _frame_pts(f) == target), None)
        earlier = keys[keys < seek_to]
        if not len(earlier):
            return None
        seek_to = int(earlier[-1])
    return None



class _Seeker:
    """Frames by exact pts, decoding forward while the next one is at most one key frame ahead.

    After a seek, frames count only from the first key frame decoded on, and a frame is taken only when
    its pts equals the one wanted. A seek that lands after the frame wanted (FFmpeg may seek by decoding
    time, with B-frames a key frame is decoded before frames shown just before it, and MPEG-TS seeks
    land on the next key frame) or past the end is retried from the key frame before, up to three times.

    Frames nothing refers to are not decoded unless wanted: before each packet the decoder is told to
    skip non-reference frames (`skip_frame` "NONREF") when the packet is not a wanted frame, which
    FFmpeg's H.264, HEVC, MPEG-4 and MPEG-2 decoders honour (others decode everything).
    """

    def __init__(self, container, stream, keys: np.ndarray, wanted: set[int]):
        self.container, self.stream, self.keys = container, stream, keys
        self.wanted = wanted
        self.context = stream.codec_context
        self.mode = None  # the skip_frame set last
        self.frames = None  # the decoding generator, None before the first seek
        self.skipped = [0]  # damaged packets met (pictures may then come out of order)
        self.last = None  # pts of the last frame decoded
        self.started = False
        self.seek_to = 0

    def _skip(self, packet) -> None:
        """Set the decoder's skip_frame for this packet (only when it changes)."""
        mode = "DEFAULT" if packet.pts in self.wanted else "NONREF"
        if mode != self.mode:
            self.context.skip_frame = mode
            self.mode = mode

    def _seek(self, pts: int) -> None:
        self.container.seek(int(pts), stream=self.stream, backward=True, any_frame=False)
        self.frames = _decoded(self.container, self.stream, self.skipped, self._skip)
        self.last, self.started, self.seek_to = None, False, pts

    def _far(self, target: int) -> bool:
        """Whether decoding forward to `target` would pass more than one key frame (or the decoder is past
        it, or has not started): then seeking is shorter."""
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

    def frame_at(self, target: int):
        """The decoded frame (an av.VideoFrame) whose pts is `target`, None where it cannot be reached."""
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
                    return frame
                if pts > target:  # the frame is not where the index puts it
                    return None
            else:  # the stream ended
                if self.started:
                    return None
                pts = self.seek_to + 1  # landed past the last key frame
            if not self._seek_earlier(pts):
                return None
        return None



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



def _decoded(container, stream, skipped: list[int] | None = None,
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



def _decode_all(path: str, keep: set[int], skipped: list[int] | None = None,
                shrink: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> tuple[np.ndarray, float, dict[int, np.ndarray], float, np.ndarray]:
    """Decode every frame in order: (start times from the stream's start, the last frame's end, the kept
    frames by index (each passed through `shrink` as it is decoded), average fps, the key frames'
    indices). A frame without a usable pts (none, or not after the previous one) is
    given the previous time plus one frame gap. Damaged packets are skipped (counted in `skipped[0]`);
    after one, the pictures the decoder puts out of order (B-frames whose references were lost) are
    dropped, so that every later frame keeps its own time.

    The decoder hands frames out in the order they are shown. Where their pts still go backwards in
    that order while their dts strictly increase (an AVI, which stores no presentation times, with
    DivX-style packed B-frames: the demuxer's guessed pts are a frame or two off, issue 23), each
    frame's time is its own dts instead, as FFmpeg's best-effort timestamp prefers the dts when the
    pts are the faultier, counted from the stream's start like every other time (issue 34); either
    way a frame's time and pixels come from the same decoded frame."""
    times: list[float] = []
    dts: list[int | None] = []  # each kept-in-order frame's dts
    backwards = False  # some frame's pts was not after the previous frame's
    kept: dict[int, np.ndarray] = {}
    keys: list[int] = []
    end = None
    shrink = shrink or (lambda image: image)
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
                if frame.key_frame:
                    keys.append(i)
                dts.append(getattr(frame, "dts", None))
                duration = getattr(frame, "duration", None)
                end = t + duration * tb if duration else None
                if i in keep:
                    kept[i] = shrink(_rgb(frame, size))
        except pyav_file_errors() as exc:
            if not times:
                raise VideoError(f"cannot decode frames of {path}: {_reason(exc)}") from None
            # a damaged tail: keep what decoded
    if not times:
        raise VideoError(f"video has no frames: {path} (nothing decodes)")
    key_indices = np.asarray(keys, dtype=np.int64)
    if backwards and (starts := _dts_times(dts, origin, tb, gap)) is not None:  # the pts were wrong: the dts
        return starts, _span_end(starts, None, header.average_fps), kept, header.average_fps, key_indices
    starts = np.asarray(times)
    return starts, _span_end(starts, end, header.average_fps), kept, header.average_fps, key_indices



def _dts_times(dts: list[int | None], origin: int | None, tb: float, gap: float) -> np.ndarray | None:
    """Frame times (s) from the frames' dts, counted from `origin` (the stream's start, in ticks; None:
    the first frame's dts); a frame without one (the last, flushed from the decoder) one gap after the
    previous. None when the first frame has none, it lies before `origin`, or the known ones do not
    strictly increase."""
    known = [d for d in dts if d is not None]
    if not dts or dts[0] is None or any(b <= a for a, b in zip(known, known[1:])):
        return None
    origin = dts[0] if origin is None else origin
    if dts[0] < origin:
        return None
    times = []
    for d in dts:
        times.append((d - origin) * tb if d is not None else times[-1] + gap)
    if any(b <= a for a, b in zip(times, times[1:])):
        return None
    return np.asarray(times, dtype=np.float64)



def _sequential(path: str, plan: Plan, guess: Timeline | None, problem: str, shrink: Shrinker
                ) -> tuple[Timeline, list[int], np.ndarray]:
    """Decode every frame in order, keeping only the sampled ones, each shrunk as it is decoded (memory:
    the sample at its final size plus one frame).

    The frames to keep are first chosen on `guess` (an index's times); if the decoded times choose
    others (or another count, which may change their size), a second pass keeps those.
    """
    first = plan(guess) if guess is not None else []
    shrink.restart(len(first))
    skipped = [0]
    starts, end, kept, fps, keys = _decode_all(path, set(first), skipped, shrink)
    if skipped[0]:
        problem = f"{problem}; {skipped[0]} damaged packets skipped (their frames are missing)"
    timeline = Timeline(starts=starts, duration=end, average_fps=fps, source="decoded frames", trusted=False,
                        problem=problem, keys=keys)
    indices = plan(timeline)
    if not set(indices) <= kept.keys() or len(indices) != len(first):
        shrink.restart(len(indices))
        kept = _decode_all(path, set(indices), shrink=shrink)[2]
    return timeline, indices, np.stack([kept[i] for i in indices])



def _sample_pyav(path: str, plan: Plan, shrink: Shrinker, distrust: str = "", keyframes: bool = False
                 ) -> tuple[Timeline, list[int], np.ndarray]:
    """Seek to the sampled frames where PyAV's index is trusted (and `distrust` gives no reason not to),
    else decode every frame in order. `keyframes`: the plan picks key frames (`timeline._keyframe_plan`),
    which are read without decoding anything else."""
    with _pyav_stream(path) as (container, stream):
        header = _header(container, stream)
        packets = _demux(container, stream)
    if len(packets.pts) == 0:
        return _sequential(path, plan, None, distrust or "the demuxer lists no timestamped frames", shrink)
    timeline = _pyav_timeline(packets, header)
    problem = distrust or timeline.problem
    if not problem and header.reordered and header.format.split(",")[0] == "avi":
        problem = "AVI stores no presentation times: with B-frames the demuxer guesses them"
    if not problem:
        indices = plan(timeline)
        shrink.restart(len(indices))
        wanted = [int(packets.pts[i]) for i in indices]
        got = _seek_decode(path, packets, wanted, shrink, keyframes)
        if got is not None:
            return timeline, indices, np.stack([got[p] for p in wanted])
        problem = "seeking did not reach the frames the index lists"
    starts = timeline.starts
    usable = bool(np.all(np.isfinite(starts)) and np.all(np.diff(starts) > 0))
    return _sequential(path, plan, timeline if usable else None, problem, shrink)
