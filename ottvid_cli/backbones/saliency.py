"""Attention saliency (the attention each token receives, paper Sec. 3.2) without materialising H x S x S:
computed with the block's attention from one pass over the scores (`attention_and_received`), or
recomputed from a block's queries and keys after it ran (`mean_attention_received`)."""

from __future__ import annotations

import torch


def mean_attention_received(
    query: torch.Tensor, key: torch.Tensor, boundaries: list[int], scale: float, chunk: int = 512
) -> torch.Tensor:
    """Attention each token receives, averaged over heads and query positions, within segments.

    query, key: (S, H, d) for S tokens (any dtype; scores in float32). boundaries: segment starts
    and the end, e.g. [0, 1024, 2048] for two segments that attend only within themselves.
    Returns (S,) float32: for key j of segment s, mean over heads h and queries i of s of
    softmax_j(q_i . k_j * scale). Queries are processed `chunk` at a time, so the memory is
    H x chunk x S_segment. Segments of equal length are batched together.
    """
    out = torch.zeros(query.shape[0], device=query.device, dtype=torch.float32)
    lengths = [b - a for a, b in zip(boundaries[:-1], boundaries[1:])]
    if lengths and all(n == lengths[0] for n in lengths):
        n, segs = lengths[0], len(lengths)
        q = query[boundaries[0] : boundaries[-1]].reshape(segs, n, *query.shape[1:]).transpose(1, 2)
        k = key[boundaries[0] : boundaries[-1]].reshape(segs, n, *key.shape[1:]).transpose(1, 2)
        out[boundaries[0] : boundaries[-1]] = _received(q, k, scale, chunk).reshape(-1)
        return out
    for a, b in zip(boundaries[:-1], boundaries[1:]):
        if b > a:
            q = query[a:b].transpose(0, 1).unsqueeze(0)
            k = key[a:b].transpose(0, 1).unsqueeze(0)
            out[a:b] = _received(q, k, scale, chunk)[0]
    return out


def _received(q: torch.Tensor, k: torch.Tensor, scale: float, chunk: int) -> torch.Tensor:
    """q, k: (B, H, n, d) -> (B, n) mean over heads and queries of the softmax attention to each key.

    Scores are built for at most `chunk` queries at a time, further limited to a budget of scores:
    about 4M (16 MB) on the CPU, so they stay in cache, one segment at a time; 64M (256 MB) on a GPU,
    where as many segments as fit go together (a few large kernels, not one small launch sequence
    per segment and chunk). The softmax is taken in place, and its normalisation folded into the
    sum over heads and queries.
    """
    batch, heads, n, _ = q.shape
    total = torch.zeros(batch, n, device=q.device, dtype=torch.float32)
    rows, together = _steps(q, chunk)  # queries per step, segments per step
    for b in range(0, batch, together):
        segs = slice(b, b + together)
        kt = k[segs].float().transpose(-1, -2)  # (b, H, d, n)
        for start in range(0, n, rows):
            scores = torch.matmul(q[segs, :, start : start + rows].float(), kt).mul_(scale)  # (b, H, r, n)
            scores.sub_(scores.amax(-1, keepdim=True)).exp_()
            weight = scores.sum(-1).reciprocal_()  # 1 / softmax normaliser, (b, H, r)
            total[segs] += torch.einsum("bhrn,bhr->bn", scores, weight)
    return total / (heads * n)


def attention_and_received(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                           chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its saliency from one pass over the scores, for a block that computes both.

    query, key, value: (B, H, n, d), B segments that attend within themselves. Returns (the attention
    output (B, H, n, d) in value's dtype, received (B, n) float32: `mean_attention_received`'s value
    for each segment). Where an attention kernel returns its per-row log-sum-exp (`attention_lse`),
    the output is that kernel's and the saliency one Q K^T pass: key j receives
    sum_i exp(q_i . k_j * scale - lse_i) (`received_from_lse`), no second max / sum normalisation.
    The output is then the one `scaled_dot_product_attention` gives. Where no such kernel runs, the
    scores are formed and normalised once for both (`shared_softmax_attention`).
    """
    found = attention_lse(query, key, value, scale)
    if found is None:
        return shared_softmax_attention(query, key, value, scale, chunk)
    out, lse = found
    return out, received_from_lse(query, key, lse, scale, chunk)


def attention_lse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output (B, H, n, d), log-sum-exp of each query's scaled scores (B, H, n) float32) from the
    attention kernel PyTorch's `scaled_dot_product_attention` itself dispatches to, or None where no
    such kernel takes these inputs. CPU: the flash kernel (`_scaled_dot_product_flash_attention_for_cpu`,
    SDPA's CPU choice without a mask); CUDA: flash for half precision and head sizes up to 256 that are
    multiples of 8 (`_scaled_dot_product_flash_attention`), else memory-efficient attention
    (`_scaled_dot_product_efficient_attention` with `compute_log_sumexp`, whose log-sum-exp rows may be
    padded: cut to n)."""
    n, dim = query.shape[-2], query.shape[-1]
    ops = torch.ops.aten
    try:
        if query.device.type == "cpu" and hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
            out, lse = ops._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, False, scale=scale)
        elif query.device.type == "cuda" and query.dtype in (torch.float16, torch.bfloat16) and dim <= 256 \
                and dim % 8 == 0 and torch.backends.cuda.flash_sdp_enabled():
            out, lse = ops._scaled_dot_product_flash_attention(query, key, value, 0.0, False, False, scale=scale)[:2]
        elif query.device.type == "cuda" and torch.backends.cuda.mem_efficient_sdp_enabled():
            out, lse = ops._scaled_dot_product_efficient_attention(query, key, value, None, True, 0.0, False,
                                                                    scale=scale)[:2]
        else:
            return None
    except (RuntimeError, NotImplementedError):  # a kernel that refuses these shapes or this build
        return None
    return out, lse[..., :n].float()


def received_from_lse(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, scale: float,
                      chunk: int = 512) -> torch.Tensor:
    """query, key (B, H, n, d) and the log-sum-exp of each query's scaled scores (B, H, n) -> (B, n)
    float32: mean over heads and queries of exp(q_i . k_j * scale - lse_i), the softmax attention key j
    receives. Scores (float32) are formed `chunk` queries at a time within `_received`'s score budget."""
    batch, heads, n, _ = query.shape
    total = torch.zeros(batch, n, device=query.device, dtype=torch.float32)
    rows, together = _steps(query, chunk)
    for b in range(0, batch, together):
        segs = slice(b, b + together)
        kt = key[segs].float().transpose(-1, -2)  # (b, H, d, n)
        for start in range(0, n, rows):
            stop = start + rows
            scores = torch.matmul(query[segs, :, start:stop].float() * scale, kt)  # (b, H, r, n)
            scores.sub_(lse[segs, :, start:stop, None]).exp_()
            total[segs] += scores.flatten(1, 2).sum(1)
    return total / (heads * n)


def shared_softmax_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                             chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_and_received` without a kernel that returns its log-sum-exp: for `chunk` queries at a
    time (within `_received`'s score budget), scores -> softmax P (float32) -> P @ V for the output and
    P's column sums for the saliency, so the scores are formed and normalised once for both."""
    batch, heads, n, _ = query.shape
    out = torch.empty(*query.shape[:-1], value.shape[-1], device=query.device, dtype=value.dtype)
    total = torch.zeros(batch, n, device=query.device, dtype=torch.float32)
    rows, together = _steps(query, chunk)
    for b in range(0, batch, together):
        segs = slice(b, b + together)
        kt = key[segs].float().transpose(-1, -2)  # (b, H, d, n)
        v = value[segs].float()
        for start in range(0, n, rows):
            stop = start + rows
            scores = torch.matmul(query[segs, :, start:stop].float() * scale, kt)  # (b, H, r, n)
            scores.sub_(scores.amax(-1, keepdim=True)).exp_()
            scores.mul_(scores.sum(-1, keepdim=True).reciprocal_())  # softmax P, in place
            out[segs, :, start:stop] = torch.matmul(scores, v).to(out.dtype)
            total[segs] += scores.flatten(1, 2).sum(1)
    return out, total / (heads * n)


def _steps(query: torch.Tensor, chunk: int) -> tuple[int, int]:
    """(queries per step, segments per step) for (B, H, n, d) queries within a budget of scores: about 4M
    (16 MB) on the CPU, 64M (256 MB) on a GPU (`_received` says why)."""
    _, heads, n, _ = query.shape
    budget = (1 << 22) if query.device.type == "cpu" else (1 << 26)
    rows = max(1, min(chunk, budget // max(heads * n, 1)))
    return rows, max(1, budget // max(heads * rows * n, 1))
