"""Frames leave the decoder at the model's size: each decoded frame is converted to RGB and resized at
once, so that a sample never holds full-resolution frames (6 MB a 1080p frame, 25 MB a 4K one).

A `FrameResize` says which size (`target(height, width, frames)`, a function of the source size and the
sample's frame count, as the Qwen processors' budgets are) and how (`resample`: the very operation the
backbone's processor applies, on a (n, 3, H, W) uint8 batch). Resizing frame by frame with the same
operation gives the same pixels as resizing the whole sample at once (every output pixel depends on one
input frame only), so a model's `pixel_values` do not change (tests/test_decode_resize.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import bicubic_kernel as _bicubic_kernel

Size = tuple[int, int]  # (height, width)
Resample = Callable[..., "object"]  # (torch (n, 3, H, W) uint8, size, scratch=None) -> (n, 3, h, w) uint8


def bicubic(batch, size: Size, scratch: dict | None = None):
    """torchvision's bicubic resize with antialiasing of a uint8 batch (n, 3, H, W), as
    `torchvision.transforms.functional.resize(batch, size, BICUBIC, antialias=True)` computes it on a
    uint8 tensor (qwen-vl-utils' `fetch_video`, what Qwen2.5-VL's and Qwen3-VL's preprocessing apply):
    each frame in float32, clamped to [0, 255], rounded back to uint8. Frame by frame, by the compiled
    kernels of `bicubic_kernel` where they run (the same pixels, about half the time), else by torch
    through one float32 buffer (`scratch` keeps the buffers between calls). Identical results
    (tests/test_decode_resize.py, tests/test_bicubic_kernel.py)."""
    import torch

    n, channels = batch.shape[:2]
    out = torch.empty((n, channels, int(size[0]), int(size[1])), dtype=torch.uint8)
    scratch = {} if scratch is None else scratch
    for i in range(n):
        frame = batch[i].permute(1, 2, 0)
        fast = _bicubic_kernel.resize(frame.numpy(), size, scratch) if frame.device.type == "cpu" else None
        if fast is None:
            out[i] = _torch_bicubic(batch[i:i + 1], size, scratch)[0]
        else:
            out[i] = torch.from_numpy(fast).permute(2, 0, 1)
    return out


def bicubic_frames(frames: np.ndarray, size: Size, scratch: dict | None = None) -> np.ndarray:
    """`bicubic` on (n, H, W, 3) uint8 frames -> (n, h, w, 3) uint8, without changing their layout."""
    import torch

    h, w = int(size[0]), int(size[1])
    out = np.empty((len(frames), h, w, frames.shape[3]), dtype=np.uint8)
    scratch = {} if scratch is None else scratch
    for i, frame in enumerate(frames):
        if _bicubic_kernel.resize(frame, size, scratch, out=out[i]) is None:
            batch = torch.from_numpy(np.require(frame, requirements=["W"])).permute(2, 0, 1)[None]  # (Pillow's: read-only)
            out[i] = _torch_bicubic(batch, size, scratch)[0].permute(1, 2, 0).numpy()
    return out


def _torch_bicubic(batch, size: Size, scratch: dict):
    """torch's own: each frame of a (n, 3, H, W) uint8 batch through one float32 buffer (torchvision's
    call allocates a strided float copy each time)."""
    import torch
    import torch.nn.functional as F

    n, channels, height, width = batch.shape
    buffer = scratch.get("float")
    if buffer is None or tuple(buffer.shape) != (1, channels, height, width):
        buffer = scratch["float"] = torch.empty((1, channels, height, width), dtype=torch.float32)
    out = torch.empty((n, channels, int(size[0]), int(size[1])), dtype=torch.uint8)
    for i in range(n):
        buffer.copy_(batch[i:i + 1])
        resized = F.interpolate(buffer, size=(int(size[0]), int(size[1])), mode="bicubic", antialias=True,
                                align_corners=False)
        out[i:i + 1] = resized.clamp_(0, 255).round_()
    return out


@dataclass(frozen=True)
class FrameResize:
    """How frames leave the decoder. `target`: the (height, width) for a frame of (height, width) in a
    sample of `frames` frames, or a fixed (height, width); `resample`: the operation on a uint8 batch
    (default `bicubic`); `contiguous`: make the batch contiguous (n, 3, H, W) before resampling, as a
    processor that calls `.contiguous()` does (a few kernels differ by memory layout)."""

    target: Callable[[int, int, int], Size] | Size
    resample: Resample = bicubic
    contiguous: bool = False

    def size(self, height: int, width: int, frames: int) -> Size:
        """The (height, width) a frame of (height, width) gets in a sample of `frames` frames."""
        if callable(self.target):
            h, w = self.target(int(height), int(width), int(frames))
        else:
            h, w = self.target
        return int(h), int(w)

    def batch(self, frames: np.ndarray, size: Size, scratch: dict | None = None) -> np.ndarray:
        """(n, H, W, 3) uint8 -> (n, h, w, 3) uint8 by `resample` (unchanged when already that size);
        `scratch`: buffers a resampling may keep between calls."""
        import torch

        if tuple(frames.shape[1:3]) == tuple(size):
            return frames
        if self.resample is bicubic:
            return bicubic_frames(frames, size, scratch)
        video = torch.from_numpy(np.require(frames, requirements=["C", "W"])).permute(0, 3, 1, 2)  # (Pillow's: read-only)
        if self.contiguous:
            video = video.contiguous()
        return self.resample(video, size).permute(0, 2, 3, 1).contiguous().numpy()


def fixed(height: int, width: int) -> FrameResize:
    """Every frame resized to (height, width) (bicubic, antialiased)."""
    if height < 1 or width < 1:
        raise ValueError(f"a frame size must be positive, got {height}x{width}")
    return FrameResize(target=(int(height), int(width)))


class Shrinker:
    """Resizes the frames of one sample as they are decoded: the target size is chosen on the first
    frame (its size after the display rotation, `source`) for a sample of `frames` frames; None
    `resize` keeps frames as decoded."""

    def __init__(self, resize: FrameResize | None, frames: int = 1):
        import threading

        self.resize = resize
        self.lock = threading.Lock()  # the size is chosen once, whichever worker thread comes first
        self.local = threading.local()  # each thread's float buffer
        self.restart(frames)

    def restart(self, frames: int) -> None:
        """Start a sample of `frames` frames (its size is chosen again on its first frame)."""
        self.frames = max(int(frames), 1)
        self.source: Size | None = None
        self.size: Size | None = None

    def __call__(self, image: np.ndarray) -> np.ndarray:
        source = (int(image.shape[0]), int(image.shape[1]))
        with self.lock:
            if self.source is None:
                self.size = source if self.resize is None else self.resize.size(*source, self.frames)
                self.source = source
        if self.resize is None:
            return image
        scratch = getattr(self.local, "scratch", None)
        if scratch is None:
            scratch = self.local.scratch = {}
        return self.resize.batch(image[None], self.size, scratch)[0]


def as_resize(value: FrameResize | Size | None) -> FrameResize | None:
    """A `FrameResize` from what a caller gave: one, a fixed (height, width), or None (frames as decoded)."""
    if value is None or isinstance(value, FrameResize):
        return value
    try:
        height, width = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"resize must be a FrameResize or a (height, width), got {value!r}") from None
    return fixed(height, width)


class Background:
    """Frames converted and shrunk in worker threads while the decoder goes on (PyAV's conversion and
    torch's resize release the GIL, so every core works: the decoder's threads and these), at most
    `depth` frames in flight, so that memory holds a few decoded frames besides the sample. `workers`:
    one per core, at most 2 (default): with key frames alone the decoder is idle and the resizing is the
    work; on a dense plan the decoder's threads take the cores the workers leave.

    `put(key, work)` queues `work()` (a frame's conversion and resize); `take()` waits for all of it and
    returns {key: result}, raising the first error a piece of work raised. Use it as a context manager:
    leaving it early (an error, an interrupt) drops what is still queued."""

    def __init__(self, depth: int = 4, workers: int | None = None):
        import os
        import threading
        from concurrent.futures import ThreadPoolExecutor

        workers = workers or max(1, min(2, os.cpu_count() or 1))
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ottvid-frames", initializer=_one_thread)
        self.slots = threading.BoundedSemaphore(depth)
        self.futures: dict = {}

    def put(self, key, work: Callable[[], np.ndarray]) -> None:
        self.slots.acquire()

        def run():
            try:
                return work()
            finally:
                self.slots.release()

        try:
            self.futures[key] = self.pool.submit(run)
        except BaseException:
            self.slots.release()
            raise

    def take(self) -> dict:
        return {key: future.result() for key, future in self.futures.items()}

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _one_thread() -> None:
    """torch's resize on this worker thread alone (OpenMP's thread count is per calling thread): its
    helper threads would spin against the decoder's, which already keep the other cores busy."""
    import torch

    torch.set_num_threads(1)
