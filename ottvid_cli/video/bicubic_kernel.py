"""torch's antialiased bicubic resize of uint8 frames (`resize.bicubic`, what qwen-vl-utils applies), computed
bit for bit by compiled kernels (numba), in about half torch's time on a 1080p frame (docs/video.md, "The
resize").

How torch computes it on the CPU (aten/src/ATen/native/cpu/UpSampleKernel.cpp:
`_separable_upsample_generic_Nd_kernel_impl`, `HelperInterpBase::_compute_indices_min_size_weights_aa`,
`interpolate_aa_single_dim` and `interpolate_aa_single_dim_zero_strides`): the width is resampled first
into a float32 buffer, then the height (a dimension whose size does not change is skipped); output i of a
dimension is sum_j x[xmin_i + j] * w_ij over its window of xsize_i inputs, accumulated in float32 in tap
order. The compiled loop rounds in one of a few ways (on x86-64 with AVX-512: the taps after the first in
groups of four, each product rounded and added in order, and the last (xsize - 1) mod 4 taps as fused
multiply-adds). The weights are torch's own (read back by interpolating a comb of ones), the windows
follow torch's formula, and which rounding the installed torch uses is found for every size by comparing a
random strip with torch's: where none matches, `resize` returns None and the caller uses torch.

The speed (`bicubic_numba`): the width pass takes the frame 16 rows at a time, transposed into a small
block, so that every output column is a sum of whole block lines (SIMD across rows); the height pass is a
sum of whole rows already. torch's loop computes one output at a time.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np

# The rounding forms tried (see _fused): taps after the first in groups of 4 / 8 / 16 with the rest fused,
# none fused, all fused. The first that matches torch on a probe is tried first afterwards.
FORMS = (4, 8, 16, 1, 0)

_loaded: list = []  # [the kernels module, or None where numba cannot be imported], once tried
_loading = threading.Lock()
_refused: list[str] = []  # why numba must stay out of this process (`refuse`)


class Plan(NamedTuple):
    """One dimension's resampling, n_in -> n_out: output i sums inputs start[i] + j, j < K, with weights
    weights[i, j] (zero outside torch's window), fused multiply-add where fused[i, j]."""

    start: np.ndarray  # (n_out,) int64
    weights: np.ndarray  # (n_out, K) float32
    fused: np.ndarray  # (n_out, K) bool


def enabled() -> bool:
    """Whether the kernels run: numba importable (the `fast` extra), OTTVID_RESIZE_KERNEL not 'torch' and
    not `refuse`d in this process."""
    if _refused or os.environ.get("OTTVID_RESIZE_KERNEL", "").lower() == "torch":
        return False
    return _kernels() is not None


def refuse(reason: str) -> bool:
    """Keep numba out of this process from now on (torch resizes), for `reason`; False if it is in already
    (imported by the kernels or anyone else)."""
    import sys

    _refused.append(reason)
    return "numba" not in sys.modules


def _kernels():
    """The compiled kernels' module (numba imported the first time), or None without numba."""
    if not _loaded:
        with _loading:
            if not _loaded:
                try:
                    import numba  # noqa: F401
                except ImportError:  # not installed (the fast extra), or one that refuses this NumPy ("Numba needs NumPy ...")
                    _loaded.append(None)
                else:
                    from . import bicubic_numba

                    _loaded.append(bicubic_numba)
    return _loaded[0]


def resize(frame: np.ndarray, size: tuple[int, int], scratch: dict | None = None,
           out: np.ndarray | None = None) -> np.ndarray | None:
    """One (H, W, C) uint8 frame (any strides) -> (h, w, C) uint8 (into `out` if given, C-contiguous),
    equal to `resize.bicubic`'s pixels; None where the kernels cannot give them (numba missing,
    OTTVID_RESIZE_KERNEL=torch, a size whose rounding matched none of FORMS). `scratch` keeps the buffers
    between calls (one dict per thread)."""
    if not enabled():
        return None
    height, width, channels = frame.shape
    h, w = int(size[0]), int(size[1])
    across = _plan("width", width, w) if w != width else None
    down = _plan("height", height, h) if h != height else None
    if (w != width and across is None) or (h != height and down is None):
        return None
    kernels = _kernels()
    scratch = {} if scratch is None else scratch
    out = np.empty((h, w, channels), dtype=np.uint8) if out is None else out
    if out.shape != (h, w, channels) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {h}x{w}x{channels} uint8 array")
    if across is None and down is None:  # the size it has: torch's resize leaves the values as they are
        out[...] = frame
        return out
    acc = _buffer(scratch, "acc", (max(kernels.ROWS, w) * channels,))  # a block's lines, or an output row
    flat = out.reshape(h, w * channels)
    if across is None:  # the height alone: torch resamples the uint8 values as floats
        source = np.ascontiguousarray(frame).reshape(height, width * channels)
        kernels.columns_uint8(source, down.start, down.weights, down.fused, flat, acc)
        return out
    mid = _buffer(scratch, "mid", (height, w, channels))
    kernels.rows(frame, across.start, across.weights, across.fused, mid,
                 _buffer(scratch, "block", (width, kernels.ROWS * channels), np.uint8), acc)
    if down is None:
        kernels.to_uint8(mid.reshape(height, w * channels), flat)
    else:
        kernels.columns_uint8(mid.reshape(height, w * channels), down.start, down.weights, down.fused, flat, acc)
    return out


def _buffer(scratch: dict, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    buffer = scratch.get(name)
    if buffer is None or buffer.shape != shape:
        buffer = scratch[name] = np.empty(shape, dtype=dtype)
    return buffer


# ------------------------------------------------------------------------------------------------ plans

_plans: dict[tuple[str, int, int], Plan | None] = {}
_first: dict[str, int] = {}  # per dimension, the form that matched last
_lock = threading.Lock()


def _plan(dimension: str, n_in: int, n_out: int) -> Plan | None:
    key = (dimension, n_in, n_out)
    with _lock:
        if key not in _plans:
            _plans[key] = _build(dimension, n_in, n_out)
        return _plans[key]


def _interpolate(x, size: tuple[int, int]):
    import torch.nn.functional as F

    return F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)


def _windows(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """torch's windows (xmin, xsize) and their largest possible size, in its float32 arithmetic
    (`_compute_index_ranges_weights`, `_compute_indices_min_size_weights_aa`)."""
    f32 = np.float32
    scale = f32(f32(n_in) / f32(n_out))  # area_pixel_compute_scale: input / output, as float
    support = f32(2.0 * float(scale)) if scale >= 1.0 else f32(2.0)  # (interp_size / 2) * scale, bicubic: 4 taps
    largest = int(np.ceil(support)) * 2 + 1
    center = (float(scale) * (np.arange(n_out) + 0.5)).astype(f32)  # scale * (i + 0.5)
    xmin = np.maximum(((center - support).astype(np.float64) + 0.5).astype(np.int64), 0)
    xsize = np.minimum(((center + support).astype(np.float64) + 0.5).astype(np.int64), n_in) - xmin
    return xmin, np.clip(xsize, 0, largest), largest


def _build(dimension: str, n_in: int, n_out: int) -> Plan | None:
    import torch

    xmin, xsize, largest = _windows(n_in, n_out)
    # torch's weights: a comb of ones every `gap` inputs meets each window at most once
    gap = largest + 1
    comb = np.zeros((gap, n_in), dtype=np.float32)
    for r in range(gap):
        comb[r, r::gap] = 1.0
    response = _interpolate(torch.from_numpy(comb)[None, None], (gap, n_out))[0, 0].numpy()  # (gap, n_out)
    taps = int(xsize.max())
    start = np.minimum(xmin, n_in - taps)  # every window read as `taps` inputs inside the frame
    offset = xmin - start
    weights = np.zeros((n_out, taps), dtype=np.float32)
    seen = np.zeros((gap, n_out), dtype=bool)
    for i in range(n_out):
        teeth = (xmin[i] + np.arange(xsize[i])) % gap  # the comb rows that meet output i's window
        weights[i, offset[i]:offset[i] + xsize[i]] = response[teeth, i]
        seen[teeth, i] = True
    if np.any(response[~seen] != 0):  # a weight outside the window: not the formula above
        return None
    forms = sorted(FORMS, key=lambda form: form != _first.get(dimension))
    for form in forms:
        plan = Plan(start, weights, _fused(offset, xsize, taps, form))
        if _matches(dimension, plan, n_in, n_out):
            _first[dimension] = form
            return plan
    return None


def _fused(offset: np.ndarray, xsize: np.ndarray, taps: int, form: int) -> np.ndarray:
    """Which taps torch's compiled loop fuses: after the first tap, `form` taps at a time are multiplied
    and added in order, the remaining (xsize - 1) mod form fused; 1: none fused; 0: all fused."""
    fused = np.zeros((len(xsize), taps), dtype=bool)
    for i, size in enumerate(xsize):
        rest = size - 1
        unfused = 1 + (rest // form) * form if form else 1
        fused[i, offset[i] + unfused:offset[i] + size] = True
    return fused


def _matches(dimension: str, plan: Plan, n_in: int, n_out: int) -> bool:
    """Whether the plan gives torch's float32 values on a random strip (3 channels, 37 lines)."""
    import torch

    kernels = _kernels()
    rng = np.random.default_rng(n_in * 7919 + n_out)
    if dimension == "width":
        strip = rng.integers(0, 256, size=(37, n_in, 3), dtype=np.uint8)
        ours = np.empty((37, n_out, 3), dtype=np.float32)
        kernels.rows(strip, plan.start, plan.weights, plan.fused, ours, np.empty((n_in, kernels.ROWS * 3), np.uint8),
                     np.empty((max(kernels.ROWS, n_out) * 3,), np.float32))
        theirs = _interpolate(torch.from_numpy(strip).permute(2, 0, 1)[None].float(), (37, n_out))[0]
        return np.array_equal(ours, theirs.permute(1, 2, 0).numpy())
    strip = rng.uniform(-30.0, 290.0, size=(n_in, 37, 3)).astype(np.float32)  # the width pass's values
    ours = np.empty((n_out, 37 * 3), dtype=np.float32)
    kernels.columns(strip.reshape(n_in, 37 * 3), plan.start, plan.weights, plan.fused, ours)
    theirs = _interpolate(torch.from_numpy(strip).permute(2, 0, 1)[None], (n_out, 37))[0]
    return np.array_equal(ours.reshape(n_out, 37, 3), theirs.permute(1, 2, 0).numpy())
