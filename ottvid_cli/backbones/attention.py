"""Attention as we run it: the vision towers' packed segments in one call per block, and the CUDA SDPA
backends chosen on purpose (docs/attention.md).

Qwen2.5-VL's and Qwen3-VL's vision blocks attend within segments of one packed sequence (windows of
a frame group, or whole frame groups), described by `cu_seqlens`. transformers' sdpa path splits the
sequence and calls attention once per segment (about 7,200 calls for 32 frames at 448 x 448 on the
7B); its flash path hands the whole packed sequence with `cu_seq_lens_q` to the registered attention
function of any implementation whose name holds "flash" (`is_flash_attention_requested`). We
register `PACKED` through the public `AttentionInterface` and give it to the vision sub-config only
(the LLM keeps sdpa): equal segments go to one batched `scaled_dot_product_attention` call; unequal
ones to a varlen kernel where one serves (flash-attn's when installed, PyTorch's own on CUDA for
short segments), else one batched call per distinct length (at most four for one video: interior,
right, bottom and corner windows).

Under `recording(module)` the attention of the marked module (the last vision block's) also returns the
attention each token receives (the saliency, docs/method.md): `packed_sdpa_saliency` for the packed towers,
`recording_attention` (`RECORDING`, transformers' sdpa otherwise) for SigLIP's batch of frames.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from .saliency import attention_and_received

PACKED = "ottvid_packed_flash"  # "flash" in the name: transformers then passes the packed segments
CUDNN_ENV = "OTTVID_CUDNN_SDPA"  # "1": leave PyTorch's cuDNN SDPA backend enabled (docs/attention.md)

_PLANS: dict[int, tuple[Any, "_Plan"]] = {}  # id(cu_seqlens) -> (weak reference, plan)
_PLANS_MAX = 8


class _Plan:
    """The segments of one `cu_seqlens`, read to the host once: their lengths and, when they are not all
    equal, the token indices of each length's segments ((m, length) on the device)."""

    def __init__(self, cu_seqlens: torch.Tensor):
        bounds = [int(v) for v in cu_seqlens.tolist()]
        self.start, self.end = bounds[0], bounds[-1]
        self.lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self.starts = [a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self.equal = len(set(self.lengths)) <= 1
        self.max = max(self.lengths, default=0)
        self.groups: list[tuple[int, torch.Tensor]] = []
        if not self.equal:
            for length in sorted(set(self.lengths)):
                starts = torch.tensor([s for s, n in zip(self.starts, self.lengths) if n == length])
                index = starts[:, None] + torch.arange(length)[None]
                self.groups.append((length, index.to(cu_seqlens.device, non_blocking=True)))


def _plan(cu_seqlens: torch.Tensor) -> _Plan:
    """The plan of this `cu_seqlens` tensor: computed once per tensor object (a vision forward passes
    the same one to every block of a kind, so the host reads it once, not once per block)."""
    entry = _PLANS.get(id(cu_seqlens))
    if entry is not None and entry[0]() is cu_seqlens:
        return entry[1]
    plan = _Plan(cu_seqlens)
    if len(_PLANS) >= _PLANS_MAX:
        for key in [k for k, (ref, _) in _PLANS.items() if ref() is None] or list(_PLANS)[:1]:
            _PLANS.pop(key, None)
    _PLANS[id(cu_seqlens)] = (weakref.ref(cu_seqlens), plan)
    return plan


def packed_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                scale: float | None = None) -> torch.Tensor:
    """Attention within the segments of a packed sequence: query, key, value (S, H, d); cu_seqlens
    (n + 1,) segment boundaries (int). Returns (S, H, d). Tokens outside [cu[0], cu[-1]) are zero."""
    plan = _plan(cu_seqlens)
    if plan.start != 0 or plan.end != query.shape[0]:
        out = torch.zeros_like(query)
        span = slice(plan.start, plan.end)
        out[span] = packed_sdpa(query[span], key[span], value[span], cu_seqlens - plan.start, scale)
        return out
    if not plan.lengths:
        return torch.zeros_like(query)
    if plan.equal:  # one call: (segments, H, length, d)
        count, length = len(plan.lengths), plan.lengths[0]
        q, k, v = (t.reshape(count, length, *t.shape[1:]).transpose(1, 2) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return out.transpose(1, 2).reshape(query.shape)
    varlen = _varlen_kernel(query, plan)
    if varlen is not None:
        cu = cu_seqlens.to(torch.int32)
        return varlen(query, key, value, cu, plan.max, scale)
    out = torch.empty_like(query)
    for length, index in plan.groups:  # one call per distinct length
        q, k, v = (t[index].transpose(1, 2) for t in (query, key, value))  # (m, H, length, d)
        out[index] = F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2).to(out.dtype)
    return out


def packed_sdpa_saliency(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                         scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`packed_sdpa` that also returns the attention each token receives: (output (S, H, d), received (S,)
    float32, for key j of segment s the mean over heads and the queries of s of their softmax attention
    to j; 0 outside [cu[0], cu[-1])). Both come from one pass over the scores
    (`saliency.attention_and_received`): equal segments in one batch, unequal ones one batch per length."""
    plan = _plan(cu_seqlens)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    tokens, heads = query.shape[0], query.shape[1]
    received = torch.zeros(tokens, device=query.device, dtype=torch.float32)
    if not plan.lengths:
        return torch.zeros_like(query), received
    if plan.equal:  # one batch: (segments, H, length, d)
        count, length = len(plan.lengths), plan.lengths[0]
        span = slice(plan.start, plan.end)
        q, k, v = (t[span].reshape(count, length, *t.shape[1:]).transpose(1, 2) for t in (query, key, value))
        out, got = attention_and_received(q, k, v, scale)
        out = out.transpose(1, 2).reshape(-1, heads, value.shape[-1])
        received[span] = got.reshape(-1)
        if plan.start == 0 and plan.end == tokens:
            return out, received
        full = query.new_zeros(tokens, heads, value.shape[-1])
        full[span] = out
        return full, received
    full = query.new_zeros(tokens, heads, value.shape[-1])
    for length, index in plan.groups:  # one batch per distinct length
        q, k, v = (t[index].transpose(1, 2) for t in (query, key, value))  # (m, H, length, d)
        out, got = attention_and_received(q, k, v, scale)
        full[index] = out.transpose(1, 2).to(full.dtype)
        received[index] = got
    return full, received


SALIENCY = "ottvid_saliency"  # the attribute a vision attention module holds while it records its saliency


@contextlib.contextmanager
def recording(module: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block: each call of `module`'s packed attention (`attend`: `packed_attention` through
    the vision sub-config, fast_vision's `PackedRotaryAttention`) also computes the attention each token
    receives, into the record yielded: "received" (S,) float32 (`packed_sdpa_saliency`, the tower's
    token order) and "cu_seqlens". `records_saliency(module)` says whether it will."""
    record: dict[str, torch.Tensor] = {}
    setattr(module, SALIENCY, record)
    try:
        yield record
    finally:
        delattr(module, SALIENCY)


def records_saliency(module: torch.nn.Module) -> bool:
    """Whether this vision attention module's attention records under `recording`: the packed one, or
    `RECORDING` (SigLIP towers)."""
    return getattr(getattr(module, "config", None), "_attn_implementation", None) in (PACKED, RECORDING)


def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           cu_seqlens: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """`packed_sdpa` for `module`'s attention; under `recording(module)` `packed_sdpa_saliency`, whose
    received attention goes to the record."""
    record = getattr(module, SALIENCY, None)
    if record is None:
        return packed_sdpa(query, key, value, cu_seqlens, scale)
    out, record["received"] = packed_sdpa_saliency(query, key, value, cu_seqlens, scale)
    record["cu_seqlens"] = cu_seqlens
    return out


def _varlen_kernel(query: torch.Tensor, plan: _Plan):
    """A one-call kernel for unequal segments, or None: flash-attn's varlen function when installed, else
    PyTorch's `varlen_attn` for segments of at most 128 tokens (where it runs its flash kernel, not
    cuDNN's); CUDA and half precision only."""
    if query.device.type != "cuda" or query.dtype not in (torch.float16, torch.bfloat16):
        return None
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    if flash_attn_varlen_func is not None:
        return lambda q, k, v, cu, most, scale: flash_attn_varlen_func(q, k, v, cu, cu, most, most,
                                                                       softmax_scale=scale)
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if plan.max > 128:
        return None
    return lambda q, k, v, cu, most, scale: varlen_attn(q, k, v, cu, cu, most, most, scale=scale)


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, scaling: float | None = None,
                     dropout: float = 0.0, cu_seq_lens_q: torch.Tensor | None = None,
                     cu_seq_lens_k: torch.Tensor | None = None, is_causal: bool | None = False,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """An `AttentionInterface` function: query, key, value (1, H, S, d) of a packed sequence whose
    segments `cu_seq_lens_q` attend only within themselves -> ((1, S, H, d), None). Without segments
    (or with a mask, causal attention or dropout) it is transformers' own sdpa function."""
    if cu_seq_lens_q is None or attention_mask is not None or is_causal or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(cu_seq_lens_k,
                                                                                            cu_seq_lens_q):
        raise ValueError("packed attention needs the same segments for queries and keys")
    if query.shape[0] != 1 or key.shape[1] != query.shape[1]:
        raise ValueError("packed attention takes one packed sequence with as many key as query heads")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (S, H, d)
    return attend(module, q, k, v, cu_seq_lens_q, scaling).unsqueeze(0), None


RECORDING = "ottvid_sdpa_saliency"  # transformers' sdpa, which records the saliency under `recording`


def recording_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None = None, scaling: float | None = None,
                        dropout: float = 0.0, is_causal: bool | None = False,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """An `AttentionInterface` function for towers that attend over a batch of whole frames (SigLIP):
    transformers' own sdpa function, except under `recording(module)`, where query, key, value
    (B, H, n, d) -> ((B, n, H, d), None) by `saliency.attention_and_received`, and the record gets
    "received" (B, n), each frame's attention received per patch (mean over heads and queries)."""
    record = getattr(module, SALIENCY, None)
    if record is None or attention_mask is not None or is_causal or dropout or key.shape[1] != query.shape[1]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out, record["received"] = attention_and_received(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


def use_recording_vision(model: Any) -> bool:
    """Give a SigLIP vision tower (`config.vision_config`) the `RECORDING` attention (registered here);
    True when set."""
    from transformers import AttentionInterface

    vision = getattr(model.config, "vision_config", None)
    if vision is None or getattr(vision, "model_type", "") not in RECORDING_TOWERS:
        return False
    AttentionInterface.register(RECORDING, recording_attention)
    set_vision_attention(model, RECORDING)
    return model.config.vision_config._attn_implementation == RECORDING


def register() -> str:
    """Register `PACKED` with transformers' AttentionInterface (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED, packed_attention)
    return PACKED


def use_packed_vision(model: Any) -> bool:
    """Give the model's vision tower (`config.vision_config`) the packed attention, the rest keeps its
    own. True when set; False for a model whose vision tower is not of the packed kind (SigLIP batches
    frames already)."""
    vision = getattr(model.config, "vision_config", None)
    if vision is None or getattr(vision, "model_type", "") not in PACKED_TOWERS:
        return False
    set_vision_attention(model, register())
    return model.config.vision_config._attn_implementation == PACKED


def set_vision_attention(model: Any, implementation: str) -> None:
    """`model.set_attn_implementation({"vision_config": implementation})`, also where transformers (5.25
    and later) refuses a registered function named "flash": it preloads every such name as flash-attn or
    a Hub kernel (modeling_utils `_check_and_adjust_attn_implementation`), while the vision attention
    looks the registered function up at run time. The sub-config then takes it as older releases set it."""
    try:
        model.set_attn_implementation({"vision_config": implementation})
    except ValueError as exc:
        if implementation not in str(exc):
            raise
        model.config.vision_config._attn_implementation = implementation


# vision towers whose attention runs over packed segments (cu_seqlens)
PACKED_TOWERS = ("qwen2_5_vl_vision", "qwen3_vl_vision", "qwen3_vl_moe_vision")
# vision towers that attend over a batch of whole frames, given `RECORDING`
RECORDING_TOWERS = ("siglip_vision_model",)


def choose_cuda_backends(device: torch.device) -> dict[str, bool]:
    """On CUDA, switch off PyTorch's cuDNN SDPA backend (it builds an execution plan on the host for
    every new shape: tens of ms per layer for each new prompt length on an H100), leaving flash and
    memory-efficient attention, which PyTorch then tries in that order, and math as the fallback.
    `OTTVID_CUDNN_SDPA=1` leaves cuDNN on. Process-wide (torch.backends.cuda); returns the backends'
    state afterwards ({} off CUDA)."""
    if device.type != "cuda":
        return {}
    if os.environ.get(CUDNN_ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    return {"cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled()}
