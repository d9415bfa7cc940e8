"""The entry points: `check_video`, `sample_frames` and `sample_fps` choose the source (a file through
decord or PyAV, a folder of frame images) and apply a sampling plan to its timeline."""

from __future__ import annotations

import math
import os
import time

from ..checks import DECODERS
from .decord import open_decord, resolve_decoder, sample_decord
from .images import checked_frame_rate, frame_files, read_image, sample_images
from .probe import checked_path, pyav_file_errors, pyav_stream, read_header, unreadable
from .inorder import sample_pyav
from .mp4 import index as _index
from .pyav import decoded, pyav_timeline
from .resize import FrameResize, Shrinker, Size, as_resize
from .workers import check_workers
from .timeline import (Plan, Timeline, Video, VideoError, checked_rule, keyframe_plan, plan_count, plan_rate, segment,
                       within)


def _sample(path: str | os.PathLike, plan: Plan, decoder: str, start: float | None = None,
            end: float | None = None, frame_rate: float | None = None, resize: FrameResize | Size | None = None,
            keyframes: bool = False, workers: int | None = None) -> Video:
    """Sample the file (or folder of frame images, at `frame_rate`) by `plan`; with `start` / `end`
    (s), only that part of it, which the Video then describes (timestamps from `start`, its length,
    its frame count). Each frame is resized by `resize` as soon as it is decoded; with `keyframes`
    each planned frame is replaced by the key frame nearest it (read with PyAV, nothing else decoded);
    `workers`: PyAV's seeking threads (`pyav.seek_decode`)."""
    chosen, planned = checked_plan(plan, decoder, start, end, keyframes, workers)
    shrink = Shrinker(as_resize(resize))
    began = time.perf_counter()
    if os.path.isdir(path):  # a folder of frame images: Pillow reads them, the decoder does not apply
        path = os.fspath(path)
        timeline, indices, frames = sample_images(path, chosen, checked_frame_rate(frame_rate), shrink)
        backend = "images"
    else:
        backend = resolve_decoder(decoder)
        path = checked_path(path)
        if backend == "decord" and not keyframes:
            timeline, indices, frames = sample_decord(path, chosen, shrink)
        else:  # key frames alone: PyAV decodes single packets, decord cannot
            timeline, indices, frames = sample_pyav(path, chosen, shrink, keyframes=keyframes, workers=workers)
        backend = "decord" if timeline.source == "decord index" else "pyav"
    timestamps, duration, total_frames = placed(timeline, indices, start, end)
    return Video(
        path=path,
        frames=frames,
        timestamps=timestamps,
        indices=indices,
        duration=duration,
        total_frames=total_frames,
        average_fps=timeline.average_fps,
        timeline=timeline,
        decoder=backend,
        source_size=shrink.source,
        keyframes=keyframes,
        planned=[max(0.0, t) for t in planned] if keyframes else None,
        decode_ms=(time.perf_counter() - began) * 1e3,
    )



def checked_plan(plan: Plan, decoder: str, start: float | None, end: float | None, keyframes: bool,
                 workers: int | None) -> tuple[Plan, list[float]]:
    """`_sample`'s checks of `decoder` and `workers` (one-line VideoErrors), then the plan it applies to a
    file's timeline (within [start, end], key frames with `keyframes`) and the list that holds, once it is
    applied, the plan's own times (from the part's start) before key frames replace them."""
    if decoder not in DECODERS:
        raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    try:
        check_workers(workers)
    except ValueError as exc:
        raise VideoError(str(exc)) from None
    planned: list[float] = []

    def remember(part: Timeline) -> list[int]:  # on the part's timeline: key frames are chosen within it
        picked = plan(part)
        planned[:] = [float(part.starts[i]) for i in picked]
        return picked

    return within(keyframe_plan(remember) if keyframes else plan, start, end), planned



def placed(timeline: Timeline, indices: list[int], start: float | None,
           end: float | None) -> tuple[list[float], float, int]:
    """The sampled frames' times from the part's start, the part's length and its frame count (the whole
    video's without `start` / `end`)."""
    first, last, lo, duration = (0, len(timeline.starts), 0.0, timeline.duration) if start is None and end is None \
        else segment(timeline, start, end)
    return [max(0.0, float(timeline.starts[i]) - lo) for i in indices], duration, last - first



def count_plan(num_frames: int, rule: str) -> Plan:
    """`sample_frames`' plan, its arguments checked."""
    if num_frames < 1:
        raise VideoError(f"the number of frames must be >= 1, got {num_frames}")
    return plan_count(num_frames, checked_rule(rule))



def rate_plan(fps: float, max_frames: int | None, rule: str) -> Plan:
    """`sample_fps`' plan, its arguments checked."""
    if not (fps > 0 and math.isfinite(fps)):
        raise VideoError(f"fps must be > 0, got {fps}")
    if max_frames is not None and max_frames < 2:
        raise VideoError(f"max_frames must be >= 2, got {max_frames}")
    return plan_rate(fps, max_frames, checked_rule(rule))



def check_video(path: str | os.PathLike, decoder: str = "auto") -> None:
    """Raise VideoError if the file is missing, unreadable or has no video frame that decodes (cheap:
    the first frame is decoded).

    PyAV reads the header and decodes up to the first frame (damaged packets skipped, as decoding
    does): a file whose frames cannot be decoded (cut off after its header, a broken codec header, a
    codec FFmpeg opens but cannot decode) is refused here, before a model is loaded, not after.
    Decoder "decord" also has decord open the file. A folder must hold frame images, the first of which must read.
    """
    if os.path.isdir(path):
        if decoder not in DECODERS:
            raise VideoError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
        read_image(frame_files(path)[0])
        return
    resolve_decoder(decoder)
    path = checked_path(path)
    skipped = [0]
    with pyav_stream(path) as (container, stream):
        stream.thread_type = "SLICE"  # one frame is wanted: frame threads would each decode one first
        try:
            decodes = next(decoded(container, stream, skipped), None) is not None
        except pyav_file_errors():
            raise unreadable(path) from None
    if not decodes:
        why = f"{skipped[0]} damaged packets, nothing decodes" if skipped[0] else "nothing decodes"
        raise VideoError(f"video has no frames: {path} ({why})")
    if decoder == "decord":
        open_decord(path)



def shown_size(path: str | os.PathLike) -> tuple[int, int]:
    """(height, width) of the video's first frame as it is shown (after its display rotation), one frame
    decoded; a folder of frame images: its first image's. What a plan's frames are resized from, known
    before any of them is decoded. VideoError for a file whose frames do not decode."""
    from .pyav import rgb

    if os.path.isdir(path):
        return tuple(read_image(frame_files(os.fspath(path))[0]).shape[:2])
    path = checked_path(path)
    with pyav_stream(path) as (container, stream):
        stream.thread_type = "SLICE"
        try:
            frame = next(decoded(container, stream, [0]), None)
        except pyav_file_errors():
            raise unreadable(path) from None
        if frame is None:
            raise VideoError(f"video has no frames: {path} (nothing decodes)")
        return tuple(rgb(frame).shape[:2])


def stated_duration(path: str | os.PathLike) -> float | None:
    """The video's length in seconds as its header states it (the stream's, else the container's), nothing
    demuxed or decoded: a cheap estimate, None for a folder, a header that states none, or a file that
    does not open."""
    if os.path.isdir(path):
        return None
    try:
        with pyav_stream(checked_path(path)) as (container, stream):
            header = read_header(container, stream)
    except VideoError:
        return None
    stated = [d for d in (header.stream_duration, header.container_duration) if d and math.isfinite(d) and d > 0]
    return stated[0] if stated else None


def video_duration(path: str | os.PathLike) -> float | None:
    """The video file's length in seconds (its last frame's end) as its container's index lists the
    frames, nothing decoded; None when the demuxer lists no frame with a time. VideoError when the file
    cannot be opened."""
    path = checked_path(path)
    with pyav_stream(path) as (container, stream):
        header = read_header(container, stream)
        packets = _index(path, container, stream)
    return pyav_timeline(packets, header).duration if len(packets.pts) else None


def sample_frames(path: str | os.PathLike, num_frames: int = 32, decoder: str = "auto",
                  start: float | None = None, end: float | None = None, frame_rate: float | None = None,
                  rule: str = "centre", resize: FrameResize | Size | None = None, keyframes: bool = False,
                  workers: int | None = None) -> Video:
    """`num_frames` frames (made even; fewer for videos with fewer frames) uniformly in time; with
    `start` / `end` (s), uniformly over that part only (MVBench's time-bounded questions). `path` may
    be a folder of frame images shown at `frame_rate` a second (default `DEFAULT_FRAME_RATE`, 3).
    `rule`: "centre" (the frame shown at each segment's centre) or an evaluation harness's
    "linspace" / "linspace-floor" (`_frames_linspace`).

    `resize`: the size frames leave the decoder at, a `FrameResize` (a backbone's `frame_resize()`: the
    size and resampling its processor applies) or a fixed (height, width); each frame is resized as soon
    as it is decoded, so full-resolution frames never accumulate (None: frames as decoded).
    `keyframes`: each frame is the key frame nearest its planned time (distinct ones where the file has
    enough), read without decoding any other frame; `Video.planned` holds the planned times.
    `workers`: how many threads decode the sampled frames of different key-frame intervals at once with
    PyAV, each with its own container (None: one per core, at most 4; 1: one container using FFmpeg's
    frame threads). The frames, their order and their times do not depend on it."""
    return _sample(path, count_plan(num_frames, rule), decoder, start, end, frame_rate, resize, keyframes, workers)



def sample_fps(path: str | os.PathLike, fps: float = 2.0, max_frames: int | None = None,
               decoder: str = "auto", start: float | None = None, end: float | None = None,
               frame_rate: float | None = None, rule: str = "centre", resize: FrameResize | Size | None = None,
               keyframes: bool = False, workers: int | None = None) -> Video:
    """Frames at `fps` per second of duration (an even count, at least 2), uniformly in time.

    With `max_frames`, longer videos are subsampled uniformly to that many frames (made even). `path`
    may be a folder of frame images shown at `frame_rate` a second (see `sample_frames`). With a
    harness `rule` ("linspace" / "linspace-floor") the count is qwen-vl-utils' `smart_nframes`
    (frames / average fps x fps, at least 4, at most `max_frames` (768 by default) and the frame
    count, made even) and the frames are spread over the indices as that rule does. `resize`,
    `keyframes` and `workers`: as for `sample_frames`.
    """
    return _sample(path, rate_plan(fps, max_frames, rule), decoder, start, end, frame_rate, resize, keyframes, workers)
