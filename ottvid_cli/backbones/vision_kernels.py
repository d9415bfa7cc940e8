"""Triton kernels for the Qwen vision towers' elementwise work (imported only where `triton` imports).

Each replaces a chain of PyTorch kernels over the whole packed sequence (16,384 tokens for 32 frames at
448 x 448) by one pass, and computes what that chain computes, in the same precision and rounding steps:
- `rms_norm`: Qwen2.5-VL's RMSNorm (float32 statistics, the normalised value rounded to the input dtype,
  then times the weight), 7 kernels -> 1;
- `rotary`: the vision rotary embedding of q and k read straight from the qkv projection's output
  (float32 products, rounded to the input dtype), 14 kernels -> 1;
- `silu_mul`: silu(gate) * up of a gated MLP from one fused gate-and-up output, 2 kernels -> 1.
Floating-point contraction is off (`enable_fp_fusion=False`): a product and a sum stay two roundings,
as in PyTorch's separate kernels. What can differ is the order of the variance's sum and the `exp`
and `rsqrt` approximations: the last bit of a float32, rarely one step of a bfloat16.

Kernels are built on first use, once per mode (Triton's interpreter on CPU tensors with
TRITON_INTERPRET=1, as the tests run them, or compiled for the GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..compression.kernels import cached_kernel, interpreting  # one cache of built kernels, per mode


def _launch(kernel, grid, *args, **meta) -> None:
    if interpreting():
        kernel[grid](*args, **meta)
    else:  # a product and a sum stay two roundings, as in PyTorch's separate kernels
        kernel[grid](*args, **meta, enable_fp_fusion=False)


def _rms_norm_rows(x_ptr, w_ptr, out_ptr, width, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < width
    x = tl.load(x_ptr + row * width + offs, mask=valid, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, axis=0) / width
    normed = (x * (1.0 / tl.sqrt(variance + eps))).to(out_ptr.dtype.element_ty)  # rounded to the input dtype
    w = tl.load(w_ptr + offs, mask=valid, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * width + offs, out, mask=valid)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype) over the last dim (statistics in float32), as
    Qwen2.5-VL's RMSNorm; the weight in x's dtype."""
    width = x.shape[-1]
    flat = x.reshape(-1, width).contiguous()
    out = torch.empty_like(flat)
    block = triton.next_power_of_2(width)
    _launch(cached_kernel("rms_norm", _rms_norm_rows), (flat.shape[0],), flat, weight.to(x.dtype).contiguous(), out,
            width, eps, BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return out.view(x.shape)


def _rotary_rows(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, heads, half,
                 HBLOCK: tl.constexpr, DBLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    which = tl.program_id(1)  # 0: q, 1: k
    dim = 2 * half
    h = tl.arange(0, HBLOCK)[:, None]
    i = tl.arange(0, DBLOCK)[None, :]
    valid = (h < heads) & (i < half)
    src = qkv_ptr + token * 3 * heads * dim + which * heads * dim + h * dim + i
    x1 = tl.load(src, mask=valid, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=valid, other=0.0).to(tl.float32)
    angle = token * dim + i
    c1 = tl.load(cos_ptr + angle, mask=i < half, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + angle + half, mask=i < half, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + angle, mask=i < half, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + angle + half, mask=i < half, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
    out1 = x1 * c1 + (-x2) * s1
    out2 = x2 * c2 + x1 * s2
    base = token * heads * dim + h * dim + i
    if which == 0:
        tl.store(q_ptr + base, out1.to(q_ptr.dtype.element_ty), mask=valid)
        tl.store(q_ptr + base + half, out2.to(q_ptr.dtype.element_ty), mask=valid)
    else:
        tl.store(k_ptr + base, out1.to(k_ptr.dtype.element_ty), mask=valid)
        tl.store(k_ptr + base + half, out2.to(k_ptr.dtype.element_ty), mask=valid)


def rotary(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The vision rotary embedding of q and k from the qkv projection's output (S, 3 * heads * d), cos and
    sin (S, d): q and k (S, heads, d) in qkv's dtype, computed in float32 (transformers'
    `apply_rotary_pos_emb_vision`)."""
    tokens = qkv.shape[0]
    dim = qkv.shape[-1] // (3 * heads)
    if dim % 2:
        raise ValueError(f"the rotary embedding needs an even head size, got {dim}")
    qkv = qkv.contiguous()
    q = torch.empty(tokens, heads, dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty_like(q)
    half = dim // 2
    _launch(cached_kernel("rotary", _rotary_rows), (tokens, 2), qkv, cos.contiguous(), sin.contiguous(), q, k, heads,
            half, HBLOCK=triton.next_power_of_2(heads), DBLOCK=triton.next_power_of_2(half), num_warps=4)
    return q, k


def _silu_mul_rows(gu_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < width
    gate = tl.load(gu_ptr + row * 2 * width + offs, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * width + width + offs, mask=valid, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)  # silu, rounded as F.silu's output
    out = (act.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * width + offs, out, mask=valid)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up (S, 2 * I) = [gate | up]: (S, I) in its dtype, each step rounded as
    PyTorch's `F.silu(gate) * up` rounds it."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    gate_up = gate_up.contiguous()
    out = torch.empty(rows, width, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _launch(cached_kernel("silu_mul", _silu_mul_rows), (rows, triton.cdiv(width, block)), gate_up, out, width,
            BLOCK=block, num_warps=4)
    return out
