"""Attention saliency recomputed from a vision block's queries and keys, without materialising H x S x S."""

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
    budget = (1 << 22) if q.device.type == "cpu" else (1 << 26)
    rows = max(1, min(chunk, budget // max(heads * n, 1)))
    together = max(1, budget // max(heads * rows * n, 1))  # segments per step
    for b in range(0, batch, together):
        segs = slice(b, b + together)
        kt = k[segs].float().transpose(-1, -2)  # (b, H, d, n)
        for start in range(0, n, rows):
            scores = torch.matmul(q[segs, :, start : start + rows].float(), kt).mul_(scale)  # (b, H, r, n)
            scores.sub_(scores.amax(-1, keepdim=True)).exp_()
            weight = scores.sum(-1).reciprocal_()  # 1 / softmax normaliser, (b, H, r)
            total[segs] += torch.einsum("bhrn,bhr->bn", scores, weight)
    return total / (heads * n)
