"""Budget allocation (paper Sec. 3.4, Eq. 8, App. C): how many tokens each frame pair removes."""

from __future__ import annotations

import torch


def allocate_budget(
    difficulty: torch.Tensor, total: int, cap: int, tau_b: float, rounding: str = "final"
) -> torch.Tensor:
    """B_t for each pair: softmax(-W_t / tau_b) * B_tot, at most `cap` per pair, summing to `total`.

    Returns a (P,) int64 tensor on the difficulty's device. See `allocate_budget_rounds`.
    """
    return allocate_budget_rounds(difficulty, total, cap, tau_b, rounding)[0]


def allocate_budget_rounds(
    difficulty: torch.Tensor, total: int, cap: int, tau_b: float, rounding: str = "final"
) -> tuple[torch.Tensor, int]:
    """Budget allocation with overflow redistribution; returns (budgets (P,) int64, overflow rounds).

    beta_t = exp(-W_t/tau_b) / sum_t' exp(-W_t'/tau_b) (Eq. 8). A pair holds at most `cap`
    operations (each source token is used at most once): any excess is carried over and shared
    by recomputing the softmax over the pairs still under their cap, until all of `total` is
    placed (App. C). Real-valued shares are then made integers by largest remainder (ties to the
    lowest pair index), so the budgets sum to `total` exactly. The allocation runs in float64 on
    the CPU (P numbers); "overflow rounds" counts the redistribution rounds after the first softmax.

    rounding="per_round" (the authors' code) makes the shares integers in every round instead:
    floor(beta_t * remaining) over the pairs still under their cap, the units left to the largest
    fractional parts (ties to the lowest pair index), each pair then clipped at its cap; what the
    clipping cut off is the next round's `remaining`, and a pair at its cap leaves.
    """
    w = difficulty.detach().to("cpu", torch.float64).reshape(-1)
    pairs = w.numel()
    _check(pairs, total, cap)
    if not torch.isfinite(w).all():
        raise ValueError("transport difficulties must be finite")
    if tau_b <= 0:
        raise ValueError(f"tau_b must be > 0, got {tau_b!r}")
    if rounding not in ("final", "per_round"):
        raise ValueError(f"budget rounding must be final or per_round, got {rounding!r}")
    share = torch.zeros(pairs, dtype=torch.float64)
    if total == 0:
        return share.long().to(difficulty.device), 0
    if rounding == "per_round":
        budgets, rounds = _integer_rounds(-w / tau_b, total, cap)
        return budgets.to(difficulty.device), rounds - 1
    remaining = float(total)
    active = torch.ones(pairs, dtype=torch.bool)
    rounds = 0
    logits = -w / tau_b
    while remaining > 1e-9 * total and bool(active.any()):
        beta = torch.softmax(logits.masked_fill(~active, float("-inf")), 0)
        take = torch.minimum(beta * remaining, cap - share)  # at most each pair's headroom
        share = torch.where(active, share + take, share)
        remaining = total - float(share.sum())
        active = share < cap - 1e-9
        rounds += 1
    return _largest_remainder(share, total, cap).to(difficulty.device), rounds - 1


def _integer_rounds(logits: torch.Tensor, total: int, cap: int) -> tuple[torch.Tensor, int]:
    """Integer shares in every round (see `allocate_budget_rounds`); returns (budgets, rounds)."""
    budgets = torch.zeros(logits.numel(), dtype=torch.long)
    active = torch.ones(logits.numel(), dtype=torch.bool)
    remaining, rounds = total, 0
    while remaining > 0 and bool(active.any()):
        rounds += 1
        share = torch.softmax(logits[active], 0) * remaining
        units = share.floor()
        left = remaining - int(units.sum())
        if left > 0:
            order = torch.sort(share - units, descending=True, stable=True).indices  # ties: lowest pair
            units[order[:left]] += 1
        index = active.nonzero().squeeze(-1)
        applied = torch.minimum(units.long(), cap - budgets[index])
        budgets[index] += applied
        remaining -= int(applied.sum())
        active[index] = budgets[index] < cap
        if int(applied.sum()) == 0:  # no room left anywhere (cannot happen once total <= P * cap)
            break
    return budgets, rounds


def uniform_budget(pairs: int, total: int, cap: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The non-adaptive ablation: B_tot spread evenly, the first pairs taking the remainder."""
    _check(pairs, total, cap)
    share = torch.full((pairs,), total / pairs if pairs else 0.0, dtype=torch.float64)
    return _largest_remainder(share, total, cap).to(device)


def _check(pairs: int, total: int, cap: int) -> None:
    if total < 0 or cap < 0:
        raise ValueError(f"budget total and cap must be >= 0, got {total} and {cap}")
    if total > pairs * cap:
        raise ValueError(f"budget {total} cannot fit into {pairs} pairs of at most {cap} operations")


def _largest_remainder(share: torch.Tensor, total: int, cap: int) -> torch.Tensor:
    """Integers that sum to `total`: floor each share, then +1 to the largest fractional parts."""
    share = share.clamp(0, cap)
    base = share.floor()
    missing = total - int(base.sum())
    if missing > 0:
        fraction = torch.where(base < cap, share - base, torch.full_like(share, -1.0))
        order = torch.sort(fraction, descending=True, stable=True).indices  # ties: lowest pair first
        base[order[:missing]] += 1
    return base.long()
