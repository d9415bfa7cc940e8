"""The compiled kernels of `bicubic_kernel` (numba; imported on the first resize, not with the package):
sums over windows in float32 in tap order, rounded as a plan's `fused` says."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import intrinsic

ROWS = 16  # rows of the frame per block of the width pass (a block of a 1080p frame: 1920 x 48 bytes)


def _compiled(function):
    """numba-compiled, releasing the GIL, cached on disk (next to this file or in the user's cache); where
    no cache directory is writable numba refuses caching (RuntimeError): compiled in each process then."""
    try:
        return njit(nogil=True, cache=True)(function)
    except RuntimeError:
        return njit(nogil=True)(function)


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (LLVM's fma)."""
    signature = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return signature, codegen


@_compiled
def _accumulate(lines, start, weights, fused, acc, n):
    """acc[:n] = sum_j lines[start + j, :n] * weights[j] in float32, in tap order (rounded as `fused`
    says)."""
    for i in range(n):
        acc[i] = np.float32(0.0)
    for j in range(weights.shape[0]):
        line = lines[start + j]
        wt = weights[j]
        if fused[j]:
            for i in range(n):
                acc[i] = _fma(np.float32(line[i]), wt, acc[i])
        else:
            for i in range(n):
                acc[i] = acc[i] + np.float32(line[i]) * wt


@_compiled
def _byte(value):
    """A float32 value as `bicubic` stores it: clamped to [0, 255], rounded half to even."""
    return np.uint8(np.rint(min(max(value, np.float32(0.0)), np.float32(255.0))))


@_compiled
def rows(frame, start, weights, fused, mid, block, acc):
    """The width pass: frame (H, W, C) uint8 -> mid (H, w, C) float32, ROWS rows at a time through
    block (W, ROWS * C), whose line x holds input column x of those rows."""
    height, width, channels = frame.shape
    for y0 in range(0, height, ROWS):
        n = min(ROWS, height - y0)
        for r in range(n):
            row = frame[y0 + r]
            for x in range(width):
                for c in range(channels):
                    block[x, r * channels + c] = row[x, c]
        for x in range(weights.shape[0]):
            _accumulate(block, start[x], weights[x], fused[x], acc, n * channels)
            for r in range(n):
                for c in range(channels):
                    mid[y0 + r, x, c] = acc[r * channels + c]


@_compiled
def columns(lines, start, weights, fused, out):
    """The height pass: lines (H, L) -> out (h, L) float32."""
    for y in range(weights.shape[0]):
        _accumulate(lines, start[y], weights[y], fused[y], out[y], out.shape[1])


@_compiled
def columns_uint8(lines, start, weights, fused, out, acc):
    """The height pass into uint8: clamped to [0, 255] and rounded half to even, as `bicubic` does."""
    for y in range(weights.shape[0]):
        _accumulate(lines, start[y], weights[y], fused[y], acc, out.shape[1])
        row = out[y]
        for i in range(row.shape[0]):
            row[i] = _byte(acc[i])


@_compiled
def to_uint8(values, out):
    """The width pass's values into uint8, where the height keeps its size."""
    for y in range(values.shape[0]):
        for i in range(values.shape[1]):
            out[y, i] = _byte(values[y, i])
