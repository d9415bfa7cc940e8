"""PyAV's sampling (`sample_pyav`): seeking to the sampled frames where the index is trusted (`pyav`),
else decoding every frame in order: the frames' times are measured by decoding them all and only the
sampled ones are kept (damaged packets skipped; the B-frame time rules). The primitives are `pyav`'s,
read through the module so that a test that wraps one sees every use."""

from __future__ import annotations

from typing import Callable, Container, Iterator

import numpy as np

from . import mp4 as _mp4
from . import pyav as _pyav
from .probe import pyav_file_errors, pyav_stream, read_header
from .resize import Shrinker
from .timeline import Plan, Timeline, VideoError, error_reason


def _decode_all(path: str, keep: set[int], skipped: list[int] | None = None,
                shrink=None
                ) -> tuple[np.ndarray, float, dict[int, np.ndarray], float, np.ndarray]:
    """Decode every frame in order: (start times from the stream's start, the last frame's end, the kept
    frames by index (each passed through `shrink` as it is decoded), average fps, the key frames'
    indices). A frame without a usable pts (none, or not after the previous one) is
    given the previous time plus one frame gap. Damaged packets are skipped (counted in `skipped[0]`);
    after one, the pictures the decoder puts out of order (B-frames whose references were lost) are
    dropped, so that every later frame keeps its own time.

    The decoder hands frames out in the order they are shown. Where their pts still go backwards in
    that order while their dts strictly increase (an AVI, which stores no presentation times, with
    DivX-style packed B-frames: the demuxer's guessed pts are a frame or two off), each
    frame's time is its own dts instead, as FFmpeg's best-effort timestamp prefers the dts when the
    pts are the faultier, counted from the stream's start like every other time; either
    way a frame's time and pixels come from the same decoded frame."""
    found: dict = {}
    kept = dict(frames_in_order(path, keep, skipped, shrink, found))
    return found["starts"], found["end"], kept, found["fps"], found["keys"]



def frames_in_order(path: str, keep: Container[int], skipped: list[int] | None = None,
                    shrink: Callable[[np.ndarray], np.ndarray] | None = None,
                    found: dict | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """`_decode_all`'s pass, frame by frame: (index, frame passed through `shrink`) for each index in
    `keep`, as soon as it is decoded (nothing else is held: `stream.py` streams a sample so). Once it
    is exhausted, `found` holds what `_decode_all` returns besides the frames: "starts", "end", "fps"
    and "keys", and "stated" (the header's length). Closing it early closes the file."""
    times: list[float] = []
    dts: list[int | None] = []  # each kept-in-order frame's dts
    backwards = False  # some frame's pts was not after the previous frame's
    keys: list[int] = []
    end = None
    shrink = shrink or (lambda image: image)
    if skipped is None:
        skipped = [0]
    found = {} if found is None else found
    with pyav_stream(path) as (container, stream):
        header = read_header(container, stream)
        tb = float(header.time_base)
        gap = 1.0 / header.average_fps if header.average_fps > 0 else 1.0 / 30
        origin = header.start_pts
        size = _pyav.stream_size(stream)
        try:
            i = -1
            for frame in _pyav.decoded(container, stream, skipped):
                pts = _pyav.frame_pts(frame)
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
                    yield i, shrink(_pyav.rgb(frame, size))
        except pyav_file_errors() as exc:
            if not times:
                raise VideoError(f"cannot decode frames of {path}: {error_reason(exc)}") from None
            # a damaged tail: keep what decoded
    if not times:
        raise VideoError(f"video has no frames: {path} (nothing decodes)")
    found["keys"], found["fps"], found["stated"] = np.asarray(keys, dtype=np.int64), header.average_fps, \
        header.stated_length()
    if backwards and (starts := _dts_times(dts, origin, tb, gap)) is not None:  # the pts were wrong: the dts
        found["starts"], found["end"] = starts, _pyav.span_end(starts, None, header.average_fps)
        return
    starts = np.asarray(times)
    found["starts"], found["end"] = starts, _pyav.span_end(starts, end, header.average_fps)



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
    timeline, kept = measured(path, problem, set(first), shrink)
    indices = plan(timeline)
    if not set(indices) <= kept.keys() or len(indices) != len(first):
        shrink.restart(len(indices))
        kept = _decode_all(path, set(indices), shrink=shrink)[2]
    return timeline, indices, np.stack([kept[i] for i in indices])



def measured(path: str, problem: str, keep: Container[int] = (), shrink: Shrinker | None = None
             ) -> tuple[Timeline, dict[int, np.ndarray]]:
    """The times of a file whose index is not trusted (`problem`: why), measured by decoding every frame
    in order (`_decode_all`), and the frames kept meanwhile (`keep`, passed through `shrink`)."""
    skipped, found = [0], {}
    kept = dict(frames_in_order(path, keep, skipped, shrink, found))
    if skipped[0]:
        problem = f"{problem}; {skipped[0]} damaged packets skipped (their frames are missing)"
    return Timeline(starts=found["starts"], duration=found["end"], average_fps=found["fps"], source="decoded frames",
                    trusted=False, problem=problem, keys=found["keys"], stated=found["stated"]), kept



def indexed(path: str, distrust: str = "") -> tuple[Timeline | None, _pyav.Packets, str]:
    """PyAV's index of the file: its timeline (None when the demuxer lists no timestamped frame), its
    packets, and why it is not trusted for seeking ("" when it is; `distrust`: a reason given)."""
    with pyav_stream(path) as (container, stream):
        header = read_header(container, stream)
        packets = _mp4.index(path, container, stream)
    if len(packets.pts) == 0:
        return None, packets, distrust or "the demuxer lists no timestamped frames"
    timeline = _pyav.pyav_timeline(packets, header)
    problem = distrust or timeline.problem
    if not problem and header.reordered and header.format.split(",")[0] == "avi":
        problem = "AVI stores no presentation times: with B-frames the demuxer guesses them"
    return timeline, packets, problem



def sample_pyav(path: str, plan: Plan, shrink: Shrinker, distrust: str = "", keyframes: bool = False,
                workers: int | None = None) -> tuple[Timeline, list[int], np.ndarray]:
    """Seek to the sampled frames where PyAV's index is trusted (and `distrust` gives no reason not to),
    else decode every frame in order. `keyframes`: the plan picks key frames (`timeline.keyframe_plan`),
    which are read without decoding anything else. `workers`: seeking threads (`pyav.seek_decode`)."""
    timeline, packets, problem = indexed(path, distrust)
    if timeline is None:
        return _sequential(path, plan, None, problem, shrink)
    if not problem:
        indices = plan(timeline)
        shrink.restart(len(indices))
        wanted = [int(packets.pts[i]) for i in indices]
        got = _pyav.seek_decode(path, packets, wanted, shrink, keyframes, workers)
        if got is not None:
            return timeline, indices, np.stack([got[p] for p in wanted])
        problem = "seeking did not reach the frames the index lists"
    starts = timeline.starts
    usable = bool(np.all(np.isfinite(starts)) and np.all(np.diff(starts) > 0))
    return _sequential(path, plan, timeline if usable else None, problem, shrink)
