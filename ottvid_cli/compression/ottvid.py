"""What OTT-Vid computes besides its stages: the token counts of each stage (`token_counts`) and the input and
report helpers of `stream.py`, which composes the stages (`compress`, `OTTVidStream`). The report and the
`Compressed` result, shared with the peer methods, are in `types.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import BUDGET_CAPS, K_ROUNDINGS, OTTVidConfig, require_choice
from .types import CompressionReport


@dataclass(frozen=True)
class TokenCounts:
    """How many tokens each stage keeps for T groups of N tokens at a ratio (see docs/method.md)."""

    M: int  # target output tokens, max(1, round(ratio * T * N))
    K: int  # tokens kept per group by the spatial stage
    B_tot: int  # temporal operations (merges + prunes) over all pairs
    r_s: float
    r_t: float


def token_counts(
    groups: int, tokens: int, ratio: float, gamma: float, k_rounding: str = "round", budget_cap: str = "K"
) -> TokenCounts:
    """M = max(1, round(r T N)); K = clamp(round(N r_s), 1, N), then within [ceil(M/T), M];
    B_tot = clamp(T K - M, 0, (T-1) cap), so exactly M tokens come out.

    k_rounding "floor" takes K = clamp(floor(N r_s), 1, N) instead; budget_cap "K-1" caps each pair
    at K - 1 operations instead of K (the authors' code; see OTTVidConfig); K is then not moved into
    [ceil(M/T), M] and the output has T K - B_tot tokens, which is M unless a clamp binds (as theirs).
    """
    require_choice("k_rounding", k_rounding, K_ROUNDINGS)
    require_choice("budget_cap", budget_cap, BUDGET_CAPS)
    r_s, r_t = ratio ** (1.0 - gamma), ratio**gamma
    m = max(1, round(ratio * groups * tokens))
    if groups == 1 or ratio >= 1.0:
        return TokenCounts(M=m, K=min(m, tokens), B_tot=0, r_s=r_s, r_t=r_t)
    k = min(max(math.floor(tokens * r_s) if k_rounding == "floor" else round(tokens * r_s), 1), tokens)
    if budget_cap == "K":
        # Exactly M out: T K >= M (enough tokens) and T K - M <= (T-1) K (removable), i.e.
        # ceil(M / T) <= K <= M. Binds only for tiny T N (never at the paper's shapes); the authors'
        # cap K - 1 keeps their own count instead.
        k = min(max(k, -(-m // groups)), m)
    b_tot = min(max(groups * k - m, 0), (groups - 1) * pair_cap(k, budget_cap))
    return TokenCounts(M=m, K=k, B_tot=b_tot, r_s=r_s, r_t=r_t)


def output_count(config: OTTVidConfig, groups: int, tokens: int) -> int:
    """How many tokens `compress` returns for `groups` x `tokens` tokens with `config`, before it runs: every
    token at ratio >= 1, else T K - B_tot (the budgets always sum to B_tot): M, unless the authors' K - 1
    cap binds (`token_counts`)."""
    if config.ratio >= 1.0:
        return groups * tokens
    counts = token_counts(groups, tokens, config.ratio, config.gamma, config.k_rounding, config.budget_cap)
    return groups * counts.K - counts.B_tot


def pair_cap(k: int, budget_cap: str = "K") -> int:
    """Operations one pair may hold: K (each source token used at most once) or K - 1."""
    return k - 1 if budget_cap == "K-1" else k


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor onto `device` without the host waiting for it (pinned, asynchronous on CUDA)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def add_total_time(report: CompressionReport) -> None:
    """Sets report.timings_ms["total"] to the sum of the stage times, when any stage was timed."""
    if report.timings_ms:
        report.timings_ms["total"] = sum(report.timings_ms.values())


def inputs_clean(inv_norm: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
    """() bool on the device: finite, non-zero inverse norms and no negative saliency."""
    return torch.isfinite(inv_norm).all() & (inv_norm > 0).all() & ~(saliency < 0).any()


def raise_unless_clean(clean: torch.Tensor | bool, x: torch.Tensor, saliency: torch.Tensor) -> None:
    """ValueError naming what is wrong with the input unless `clean` (see `inputs_clean`)."""
    if bool(clean):
        return
    if bool((saliency < 0).any()):
        raise ValueError("saliency must be non-negative")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("features contain NaN or Inf")
    raise ValueError("features are too large for float32 cosine similarities")
