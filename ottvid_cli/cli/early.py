"""Decode while the model loads: a one-shot `ask` / `ground` starts decoding the video in a background
thread before the weights load (the decoder works on the CPU, loading on the disk and the device), and
joins before the vision encoder. The frames leave the decoder at the model's size, read from the
checkpoint's config and video processor alone (`backbones.frame_plan`). A video that cannot be decoded
interrupts the load at once: its one-line error is the run's, as without the overlap."""

from __future__ import annotations

import _thread
import threading
import time
from typing import Any, Callable


class EarlyDecode:
    """The video decoded in a daemon thread; `join()` returns the `video.Video` (its `decode_ms` is the
    decoding's own time) or raises what decoding raised. `failed` says whether it raised (checked by the
    main thread after an interrupt). `overlap_ms`: how much of the decoding ran while the main thread did
    other work (imports, loading, warming up), before it began to wait in `join()`."""

    def __init__(self, path: str, sampling: Any, default_frames: int, resize: Any):
        self.path, self.sampling, self.default_frames, self.resize = path, sampling, default_frames, resize
        self.video = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.interrupted = False  # the main thread was interrupted because decoding failed
        self.began = self.ended = self.waited = time.perf_counter()  # decoding's start and end; join's start
        self.thread = threading.Thread(target=self._run, name="ottvid-decode", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.began = time.perf_counter()
        from ..video import VideoError

        try:
            self.video = self.sampling.decode(self.path, self.default_frames, resize=self.resize)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by join()
            self.error = exc
            if isinstance(exc, (VideoError, ValueError)):  # the user's file: stop the load, say why at once
                self.interrupted = True
                _thread.interrupt_main()
        finally:
            self.ended = time.perf_counter()
            self.done.set()

    @property
    def overlap_ms(self) -> float:
        return max(0.0, min(self.ended, self.waited) - self.began) * 1e3

    @property
    def failed(self) -> bool:
        return self.done.is_set() and self.error is not None

    def join(self):
        """The decoded video, once decoding is done; what decoding raised, raised here (also when its
        interrupt of the main thread lands here rather than during the load)."""
        self.waited = time.perf_counter()
        try:
            while not self.done.wait(0.1):  # in slices, so that Ctrl-C reaches the main thread meanwhile
                pass
            time.sleep(0)  # an interrupt decoding sent lands by now, inside this try
        except KeyboardInterrupt:
            if not self.interrupted:
                raise
        if self.error is not None:
            raise self.error
        return self.video


EARLY_MAX_FRAMES = 128  # a sample of at most this many frames is decoded whole while the model loads (`short`)


def short(sampling: Any, video: str | None = None) -> bool:
    """Whether a sample is decoded whole while the model loads: every frame at once asked for, or at most
    EARLY_MAX_FRAMES frames (at most --chunk-frames when given): a fixed count, or a rate over the length
    the file's header states (nothing demuxed). A longer one is prepared chunk by chunk (`chunked`)."""
    chunk = sampling.chunk_frames
    if chunk == "all":
        return True
    most = chunk if isinstance(chunk, int) else EARLY_MAX_FRAMES
    if sampling.fps is None:
        return (sampling.frames or 64) <= most
    from ..video import stated_duration

    seconds = stated_duration(video) if video is not None else None
    if seconds is None:
        return False
    frames = seconds * sampling.fps
    return min(frames, sampling.max_frames or frames) <= most


def start(model: str, video: str, sampling: Any) -> EarlyDecode | None:
    """Start decoding `video` for `model` now (None where the checkpoint's sizes cannot be read without
    loading it: the run then decodes after loading, as before)."""
    from ..backbones import frame_plan

    plan = frame_plan(model)
    if plan is None:
        return None
    default_frames, make_resize = plan
    return EarlyDecode(video, sampling, default_frames, make_resize(sampling.max_pixels, sampling.min_pixels))


def overlapped(decoding: EarlyDecode | None, work: Callable[[], Any]) -> Any:
    """work() (loading the model, warming it up) while `decoding` runs. A decoding that fails interrupts
    it: then None is returned, and `decoding.join()` raises the decoder's error; any other interrupt
    (Ctrl-C) goes on as one."""
    try:
        return work()
    except KeyboardInterrupt:
        if decoding is None or not decoding.interrupted:
            raise
        return None
