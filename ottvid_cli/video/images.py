"""Folders of frame images (MVBench's episodic_reasoning stores its clips so): the images in natural
order of their names, frame i shown from i / frame_rate s; only the sampled images are read (Pillow)."""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..interrupt import checkpoint
from .resize import Shrinker
from .timeline import Plan, Timeline, VideoError, error_reason


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")

DEFAULT_FRAME_RATE = 3.0  # frames a second of a folder of frame images: MVBench's (tvqa frames_fps3_hq)



def checked_frame_rate(rate: float | None) -> float:
    """A folder's frame rate (None: `DEFAULT_FRAME_RATE`); a one-line VideoError unless finite and > 0."""
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



def read_image(path: str) -> np.ndarray:
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
        reason = "not an image Pillow can read" if isinstance(exc, UnidentifiedImageError) else error_reason(exc)
        raise VideoError(f"cannot read frame image {path}: {reason}") from None



def images_timeline(count: int, rate: float) -> Timeline:
    """Frame i of a folder is shown from i / rate s; the folder lasts count / rate s."""
    return Timeline(starts=np.arange(count, dtype=np.float64) / rate, duration=count / rate, average_fps=rate,
                    source="frame images", trusted=True, keys=np.arange(count, dtype=np.int64))  # each image stands alone



def sample_images(folder: str, plan: Plan, rate: float, shrink: Shrinker) -> tuple[Timeline, list[int], np.ndarray]:
    """Sample a folder of frame images by `plan` on their times (i / rate); only the sampled images are
    read, each shrunk as soon as it is read. They must all have one size: resizing some would change
    their aspect silently."""
    files = frame_files(folder)
    timeline = images_timeline(len(files), rate)
    indices = plan(timeline)
    shrink.restart(len(indices))
    images: dict[int, np.ndarray] = {}
    for i in indices:
        if i not in images:
            images[i] = read_sampled(folder, files, i, files[indices[0]], shrink)
    return timeline, indices, np.stack([images[i] for i in indices])



def read_sampled(folder: str, files: list[str], i: int, first: str, shrink: Shrinker) -> np.ndarray:
    """Frame image `files[i]` of a sample, read and shrunk; VideoError when its size is not that of the
    sample's first image (`first`, the one the shrinker saw first)."""
    checkpoint("reading the frame images")
    image = read_image(files[i])
    if shrink.source is not None and image.shape[:2] != shrink.source:
        (h0, w0), (h, w) = shrink.source, image.shape[:2]
        raise VideoError(f"frame images differ in size: {os.path.basename(first)} is {w0}x{h0}, "
                         f"{os.path.basename(files[i])} is {w}x{h} (in {folder})")
    return shrink(image)
