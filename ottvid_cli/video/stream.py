"""Sampling a long video chunk by chunk (an hour at 2 fps is 7,200 frames): `stream_frames` / `stream_fps`
fix the plan (frames, times, timeline) as `sample_frames` / `sample_fps` do, keeping no frame, and
`StreamedVideo.chunks(n)` hands the frames out `n` at a time, decoded and resized by a background thread
at most one chunk ahead: memory holds about two chunks of frames however long the video. The chunks
together are `sample_*`'s `Video.frames`, bit for bit. How each source streams:

- PyAV, index trusted: one `pyav.seek_decode` per chunk (its `workers` threads; a key-frame interval
  split between two chunks is decoded up to the split twice). After a seek that does not reach its
  frames, the rest are decoded in order from the start and taken by their pts (`pyav.frames_by_pts`);
  a planned frame that does not come is a VideoError. (`sample_*` would measure such a file's times by
  decoding it and plan again; here the plan is fixed before the first chunk: the index's.)
- PyAV, index not trusted (or none): the plan depends on the decoded times, so the file is decoded
  twice: a first pass keeping no frame (when the plan is made), a second keeping the planned frames.
- decord (asked for by name): `decord.DECORD_CHUNK` frames a batch within each chunk.
- a folder of frame images: each chunk's images read as the chunk is built.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import numpy as np

from ..interrupt import cancelled, checkpoint, current, stop_when
from . import inorder as _inorder
from . import pyav as _pyav
from .decord import DECORD_CHUNK, decord_file_errors, open_decord, resolve_decoder, trusted_reader
from .images import checked_frame_rate, frame_files, images_timeline, read_sampled
from .probe import checked_path
from .resize import FrameResize, Shrinker, Size, as_resize
from .sample import checked_plan, count_plan, placed, rate_plan
from .timeline import Plan, Timeline, Video, VideoError, error_reason

Read = Callable[[int, Shrinker], Iterator[np.ndarray]]  # (frames a chunk, the sample's shrinker) -> the chunks


@dataclass
class StreamedVideo:
    """A sample's plan, its frames handed out by `chunks`: everything `Video` describes but the frames.

    timestamps, indices, duration, total_frames, average_fps, timeline, decoder, keyframes, planned: as
    `Video`'s, known before any frame is decoded. `source_size` (the frames' (height, width) as decoded,
    after the display rotation, before `resize`) and `size` (the (height, width) they come out at) are
    chosen on the first frame decoded, as `sample_*` chooses them: None until `chunks` hands out its
    first chunk (not from the header: rotations and streams whose size changes part way mislead it)."""

    path: str
    timestamps: list[float]
    indices: list[int]
    duration: float
    total_frames: int
    average_fps: float
    timeline: Timeline = field(repr=False, default=None)  # type: ignore[assignment]
    decoder: str = ""
    source_size: Size | None = None
    keyframes: bool = False
    planned: list[float] | None = None
    size: Size | None = None
    _read: Read | None = field(repr=False, compare=False, default=None)
    _resize: FrameResize | None = field(repr=False, compare=False, default=None)

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the sample over the video's duration."""
        return len(self.indices) / self.duration if self.duration > 0 else float(len(self.indices))

    @property
    def stated_duration(self) -> float | None:
        """As `Video.stated_duration`: the file's length as its header states it (s), None where it states none."""
        return None if self.timeline is None else self.timeline.stated

    @property
    def truncated(self) -> bool:
        """As `Video.truncated`: the file's frames end clearly before its header's length (`Timeline.cut_short`)."""
        return self.timeline is not None and self.timeline.cut_short

    def chunks(self, frames: int) -> Iterator[np.ndarray]:
        """The sampled frames in order, `frames` at a time ((n_i, H, W, 3) uint8, the last chunk may be
        shorter), decoded and resized in a background thread at most one chunk ahead: it builds chunk k + 1
        while the caller holds chunk k, then waits. Closing the generator early (break, an exception in the
        caller, generator.close()) stops the thread at its next packet or frame and waits for it; errors
        there are raised here (a VideoError stays one). The caller's `interrupt.stop_when` scope reaches the
        thread. Every chunk concatenated equals `sample_frames` / `sample_fps`'s `Video.frames` for the same
        arguments, bit for bit. Each call decodes afresh."""
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ValueError(f"frames per chunk must be a positive whole number, got {frames!r}")
        return self._chunks(frames)

    def _chunks(self, frames: int) -> Iterator[np.ndarray]:
        count = -(-len(self.indices) // frames)
        if not count:
            return
        shrink = Shrinker(self._resize, len(self.indices))  # one size for the whole sample, as `sample_*`
        ahead = _Ahead(self._read(frames, shrink), count)
        try:
            for k in range(count):
                chunk = ahead.take()
                if k == 0:
                    self.source_size, self.size = shrink.source, shrink.size
                yield chunk
                del chunk
        finally:
            ahead.close()

    def to_video(self, frames: np.ndarray) -> Video:
        """A `Video` of this plan with these frames (all of them: the chunks concatenated; small clips, tests)."""
        if len(frames) != len(self.indices):
            raise ValueError(f"{len(frames)} frames for a sample of {len(self.indices)}")
        return Video(path=self.path, frames=frames, timestamps=list(self.timestamps), indices=list(self.indices),
                     duration=self.duration, total_frames=self.total_frames, average_fps=self.average_fps,
                     timeline=self.timeline, decoder=self.decoder, source_size=self.source_size,
                     keyframes=self.keyframes, planned=None if self.planned is None else list(self.planned))


class _Ahead:
    """`count` chunks of `source` built in a daemon thread at most one ahead of the caller: chunk k + 1 is
    begun once chunk k is taken (`take`), so the thread holds the chunk it builds or one not yet taken. It
    runs in a copy of the caller's context under a `stop_when` scope that says stop after `close` or when
    the caller's scope does: the decoders' `checkpoint()`s (a packet, a frame image, a batch) end it."""

    def __init__(self, source: Iterator[np.ndarray], count: int):
        self.done: queue.Queue = queue.Queue()  # (chunk, error); never more than one: `go` paces the thread
        self.go = threading.Semaphore(1)  # chunks the thread may begin: the first at once, then one a take
        self.stop = threading.Event()
        outer = current()  # the caller's scope: the thread honours it too

        def cancel() -> bool:
            return self.stop.is_set() or cancelled(outer)

        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run, source, count, cancel),
                                       name="ottvid-stream", daemon=True)
        self.thread.start()

    def _run(self, source: Iterator[np.ndarray], count: int, cancel: Callable[[], bool]) -> None:
        try:
            with stop_when(cancel), contextlib.closing(source):  # closing: the source's files close here
                for _ in range(count):
                    self.go.acquire()
                    if self.stop.is_set():
                        return
                    checkpoint("decoding the video")
                    chunk = next(source, None)
                    if chunk is None:
                        raise RuntimeError("the video's frames ended before the sample's last chunk")
                    self.done.put((chunk, None))
                    del chunk
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by `take`
            if not self.stop.is_set():
                self.done.put((None, exc))

    def take(self) -> np.ndarray:
        """The next chunk (waiting for it), or the error that stopped the thread; lets the next one begin."""
        while True:
            try:
                chunk, error = self.done.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.done.empty():
                    raise RuntimeError("the decoding thread ended without its chunk") from None
        if error is not None:
            raise error
        self.go.release()
        return chunk

    def close(self) -> None:
        """Stop the thread, wait for it (its files closed, its frames dropped) and drop a chunk left over."""
        self.stop.set()
        self.go.release()  # a thread waiting to begin a chunk wakes and ends
        self.thread.join()
        while not self.done.empty():
            self.done.get_nowait()


def _spans(count: int, frames: int) -> Iterator[tuple[int, int]]:
    """(first, last + 1) positions in the sample of each chunk of `frames`."""
    for first in range(0, count, frames):
        yield first, min(first + frames, count)


def _filled(count: int, images: Iterator[np.ndarray]) -> np.ndarray:
    """`count` frames from `images` in one (count, H, W, 3) array, filled as they come (no list of them)."""
    out, n = None, 0
    for n, image in enumerate(images, 1):
        if out is None:
            out = np.empty((count, *image.shape), dtype=image.dtype)
        out[n - 1] = image
    if out is None or n != count:
        raise RuntimeError(f"{n} frames for a chunk of {count}")
    return out


def _handed(wanted: list[int], got: dict[int, np.ndarray]) -> Iterator[np.ndarray]:
    """got[p] for each p of `wanted`, each dropped from `got` as it is handed out for the last time (so
    that a chunk's frames are held once, not twice, while the chunk is filled)."""
    left = Counter(wanted)
    for p in wanted:
        left[p] -= 1
        yield got[p] if left[p] else got.pop(p)


def _last_kept(frame: Callable[[int], np.ndarray]) -> Callable[[int], np.ndarray]:
    """`frame(i)`, remembering the last frame made: plans are in order, so a repeated frame comes in a row."""
    last: list = [None, None]

    def get(i: int) -> np.ndarray:
        if last[0] != i:
            last[:] = [None, None]  # the previous frame dropped before the next is made
            last[:] = [i, frame(i)]
        return last[1]

    return get


# --------------------------------------------------------------------------- the sources


def _image_chunks(folder: str, files: list[str], indices: list[int], frames: int,
                  shrink: Shrinker) -> Iterator[np.ndarray]:
    image = _last_kept(lambda i: read_sampled(folder, files, i, files[indices[0]], shrink))
    for a, b in _spans(len(indices), frames):
        yield _filled(b - a, (image(i) for i in indices[a:b]))


def _decord_chunks(path: str, opened: list, indices: list[int], frames: int, shrink: Shrinker) -> Iterator[np.ndarray]:
    """decord's frames, `DECORD_CHUNK` full-size frames at a time, each shrunk at once (`sample_decord`);
    `opened`: the reader the plan opened (used once), else a new one."""
    reader = opened.pop() if opened else open_decord(path)

    def batches(a: int, b: int) -> Iterator[np.ndarray]:
        for at in range(a, b, DECORD_CHUNK):
            checkpoint("decoding the video")
            batch = reader.get_batch(indices[at:min(at + DECORD_CHUNK, b)]).asnumpy()
            if not (batch.ndim == 4 and batch.shape[-1] == 3):
                raise VideoError(f"decord cannot decode frames of {path}: frames of shape {batch.shape[1:]}, not RGB")
            for image in batch:
                yield shrink(image)

    try:
        if indices[0] > 0:  # the first frame first, as `sample_decord` does
            reader.get_batch([0])
        for a, b in _spans(len(indices), frames):
            yield _filled(b - a, batches(a, b))
    except decord_file_errors() as exc:
        raise VideoError(f"decord cannot decode frames of {path}: {error_reason(exc)}") from None


def _in_order_chunks(path: str, indices: list[int], frames: int, shrink: Shrinker) -> Iterator[np.ndarray]:
    """The planned frames of a file decoded in order (the second pass: the first measured the times)."""
    walk = _inorder.frames_in_order(path, set(indices), shrink=shrink)  # (index, frame) of each planned one

    def frame(i: int) -> np.ndarray:
        for at, image in walk:
            if at == i:
                return image
        raise VideoError(f"decoding {path} again did not give its frame {i} (the first pass did)")

    image = _last_kept(frame)
    with contextlib.closing(walk):
        for a, b in _spans(len(indices), frames):
            yield _filled(b - a, (image(i) for i in indices[a:b]))


def _seek_chunks(path: str, packets: _pyav.Packets, timeline: Timeline, indices: list[int], keyframes: bool,
                 workers: int | None, frames: int, shrink: Shrinker) -> Iterator[np.ndarray]:
    """Each chunk's frames by one `seek_decode` call; after a seek that fails, in order by pts
    (`pyav.frames_by_pts`)."""
    fallback = None
    try:
        for a, b in _spans(len(indices), frames):
            wanted = [int(packets.pts[i]) for i in indices[a:b]]
            got = _pyav.seek_decode(path, packets, wanted, shrink, keyframes, workers) if fallback is None else None
            if got is None:
                if fallback is None:
                    fallback = _pyav.frames_by_pts(path, shrink)
                    next(fallback)
                got = {}
                for i, pts in zip(indices[a:b], wanted):
                    if pts not in got:
                        got[pts] = fallback.send(pts)
                        if got[pts] is None:
                            raise VideoError(f"cannot decode frame {i} ({timeline.starts[i]:.3f} s) of {path}: seeking "
                                             "does not reach it and decoding in order does not give it")
            yield _filled(b - a, _handed(wanted, got))
    finally:
        if fallback is not None:
            fallback.close()


# --------------------------------------------------------------------------- the plans


def _plan_pyav(path: str, plan: Plan, keyframes: bool, workers: int | None) -> tuple[Timeline, list[int], Read]:
    """`inorder.sample_pyav`'s choice, without its frames: seeking where the index is trusted, else the
    times measured by decoding every frame (keeping none) and the frames from a second pass. A file none
    of whose frames decodes from the start is refused here as `sample_*` refuses it (after its seek)."""
    timeline, packets, problem = _inorder.indexed(path)
    if not problem and not _pyav.first_decodes(path):
        problem = "seeking did not reach the frames the index lists"  # `sample_pyav`'s, when its seek fails
    if problem:
        timeline = _inorder.measured(path, problem)[0]
        indices = plan(timeline)
        return timeline, indices, partial(_in_order_chunks, path, indices)
    indices = plan(timeline)
    return timeline, indices, partial(_seek_chunks, path, packets, timeline, indices, keyframes, workers)


def _plan_decord(path: str, plan: Plan) -> tuple[Timeline, list[int], Read]:
    """`decord.sample_decord`'s plan (and its refusals), without its frames."""
    reader, timeline = trusted_reader(path)
    indices = plan(timeline)
    return timeline, indices, partial(_decord_chunks, path, [reader], indices)


def _stream(path: str | os.PathLike, plan: Plan, decoder: str, start: float | None, end: float | None,
            frame_rate: float | None, resize: FrameResize | Size | None, keyframes: bool,
            workers: int | None) -> StreamedVideo:
    """`sample._sample`'s plan and checks (the same one-line VideoErrors), its frames left to `chunks`."""
    chosen, planned = checked_plan(plan, decoder, start, end, keyframes, workers)
    resize = as_resize(resize)
    if os.path.isdir(path):
        path = os.fspath(path)
        rate = checked_frame_rate(frame_rate)
        files = frame_files(path)
        timeline = images_timeline(len(files), rate)
        indices = chosen(timeline)
        read: Read = partial(_image_chunks, path, files, indices)
        backend = "images"
    else:
        backend = resolve_decoder(decoder)
        path = checked_path(path)
        if backend == "decord" and not keyframes:
            timeline, indices, read = _plan_decord(path, chosen)
        else:
            timeline, indices, read = _plan_pyav(path, chosen, keyframes, workers)
        backend = "decord" if timeline.source == "decord index" else "pyav"
    timestamps, duration, total_frames = placed(timeline, indices, start, end)
    return StreamedVideo(path=path, timestamps=timestamps, indices=indices, duration=duration,
                         total_frames=total_frames, average_fps=timeline.average_fps, timeline=timeline,
                         decoder=backend, keyframes=keyframes,
                         planned=[max(0.0, t) for t in planned] if keyframes else None, _read=read, _resize=resize)


def stream_frames(path: str | os.PathLike, num_frames: int = 32, decoder: str = "auto", start: float | None = None,
                  end: float | None = None, frame_rate: float | None = None, rule: str = "centre",
                  resize: FrameResize | Size | None = None, keyframes: bool = False,
                  workers: int | None = None) -> StreamedVideo:
    """`sample_frames`' sample (the same arguments and checks) as a plan whose frames `chunks(n)` hands out."""
    return _stream(path, count_plan(num_frames, rule), decoder, start, end, frame_rate, resize, keyframes, workers)


def stream_fps(path: str | os.PathLike, fps: float = 2.0, max_frames: int | None = None, decoder: str = "auto",
               start: float | None = None, end: float | None = None, frame_rate: float | None = None,
               rule: str = "centre", resize: FrameResize | Size | None = None, keyframes: bool = False,
               workers: int | None = None) -> StreamedVideo:
    """`sample_fps`' sample (the same arguments and checks) as a plan whose frames `chunks(n)` hands out."""
    return _stream(path, rate_plan(fps, max_frames, rule), decoder, start, end, frame_rate, resize, keyframes,
                   workers)
