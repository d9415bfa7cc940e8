"""Helpers shared by the peer methods (docs/methods.md, "Shared rules").

Every method works on flat token indices t*N + n. It decides which tokens are kept (the roots,
each at its own position) and which root represents each other token (its *owner*, -1 if
dropped); `assemble` turns that into a `Compressed`. Shapes: features (T, N, D), saliency (T, N).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Mapping

import torch

from ..merge import Collapse, average_components
from ..types import Compressed, check_shapes
from .registry import MethodReport, target_count


def check_ratio(ratio: float) -> None:
    """ValueError unless 0 < ratio <= 1."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
            or not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")


def check_flags(exact: bool, bug_compatible: bool = False) -> None:
    """ValueError unless both are bools and bug_compatible comes with exact=False."""
    for name, value in (("exact", exact), ("bug_compatible", bug_compatible)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if bug_compatible and exact:
        raise ValueError("bug_compatible=True reproduces the official token count: set exact=False too")


def check_inputs(features: torch.Tensor, saliency: torch.Tensor | None,
                 grid: tuple[int, int]) -> tuple[int, int, torch.Tensor]:
    """(T, N, saliency as float32) after compress()'s shape checks; ValueError on NaN or Inf.

    saliency None means "no signal": all zeros, so every ranking falls back to the lowest index.
    """
    if saliency is None:
        if features.dim() != 3:
            raise ValueError(f"features must be (T, N, D), got shape {tuple(features.shape)}")
        saliency = torch.zeros(features.shape[:2], device=features.device)
    groups, tokens = check_shapes(features, saliency, grid)
    s = saliency.float()
    # one host read for both checks; only a non-finite feature sum (NaN, Inf, or an overflow) pays for
    # the exact check
    finite_sum = torch.isfinite(features.sum(dtype=torch.float32))
    if bool(torch.isfinite(s).all() & finite_sum):
        return groups, tokens, s
    if not bool(torch.isfinite(s).all()):
        raise ValueError("saliency contains NaN or Inf")
    if not bool(torch.isfinite(features).all()):
        raise ValueError("features contain NaN or Inf")
    return groups, tokens, s


def signal(signals: Mapping[str, Any] | None, name: str, shape: tuple[int, int | None],
           device: torch.device) -> torch.Tensor | None:
    """signals[name] as float32 on `device`, None when absent (registry.py, "signals"). shape: (T, N), or
    (T, None) for any width >= 1; ValueError on another shape or on NaN / Inf."""
    value = (signals or {}).get(name)
    if value is None:
        return None
    if not torch.is_tensor(value) or value.dim() != 2 or value.shape[0] != shape[0] \
            or (shape[1] is not None and value.shape[1] != shape[1]) or value.shape[1] < 1:
        want = f"({shape[0]}, {shape[1] if shape[1] is not None else 'D'})"
        got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
        raise ValueError(f"signals[{name!r}] must be a {want} tensor, got {got}")
    value = value.to(device=device, dtype=torch.float32)
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"signals[{name!r}] contains NaN or Inf")
    return value


def descending(score: torch.Tensor) -> torch.Tensor:
    """Indices sorting the last dim by decreasing score, ties to the lowest index."""
    return torch.sort(score, dim=-1, descending=True, stable=True).indices


def rank_mask(order: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(T, N) bool: the first counts[t] entries of each row's `order` (a permutation per row)."""
    n = order.shape[-1]
    first = torch.arange(n, device=order.device) < counts.to(order.device).unsqueeze(-1)
    return torch.zeros_like(first).scatter_(-1, order, first)


def split_evenly(total: int, score: torch.Tensor) -> torch.Tensor:
    """Split `total` tokens over T frames: floor(total / T) each, one more for the total % T frames
    with the largest `score` (T,), ties to the earliest frame. Returns (T,) long counts."""
    frames = score.shape[0]
    base, extra = divmod(int(total), frames)
    counts = torch.full((frames,), base, dtype=torch.long, device=score.device)
    if extra:
        counts[descending(score.float())[:extra]] += 1
    return counts


def largest_remainder(total: int, weights: list[int]) -> list[int]:
    """Integers proportional to `weights` summing to `total` (largest remainder, ties to the first)."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    left = total - sum(shares)
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


def identity(features: torch.Tensor, report: MethodReport) -> Compressed:
    """Every token kept, unchanged (ratio 1)."""
    groups, tokens = features.shape[:2]
    every = torch.arange(groups * tokens, device=features.device)
    report.kept = groups * tokens
    return Compressed(features=features.reshape(groups * tokens, -1).clone(), index=every,
                      assignment=every.clone(), report=report)


def new_report(method: str, groups: int, tokens: int, config: Any) -> MethodReport:
    """The report of one call: M is the exact retention max(1, round(ratio T N)) whatever `exact` says."""
    return MethodReport(method=method, T=groups, N=tokens, M=target_count(config.ratio, groups, tokens),
                        kept=0, config=asdict(config))


def begin(method: str, features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
          config: Any) -> tuple[int, int, torch.Tensor, MethodReport, Compressed | None]:
    """What every method does first: (T, N, saliency float32, its report, and the output already
    when an exact call keeps every token (ratio 1: the identity), else None)."""
    groups, tokens, s = check_inputs(features, saliency, grid)
    report = new_report(method, groups, tokens, config)
    keep_all = getattr(config, "exact", True) and report.M == groups * tokens
    return groups, tokens, s, report, identity(features, report) if keep_all else None


def owner_of_kept(kept: torch.Tensor) -> torch.Tensor:
    """Owner array for a pure pruning: kept (T*N,) bool -> each kept token owns itself, the rest -1."""
    node = torch.arange(kept.numel(), device=kept.device)
    return torch.where(kept, node, torch.full_like(node, -1))


def roots_of(owner: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """The kept tokens (those that own themselves), ascending: the output's `index`. `size`: their
    number when the caller knows it, so that the host does not wait for the device to count them."""
    node = torch.arange(owner.numel(), device=owner.device)
    if size is not None:
        return torch.nonzero_static(owner == node, size=size).squeeze(-1)
    return node[owner == node]


def rows_of(owner: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The output row representing each token (the `assignment`): its owner's rank among the roots, -1 if dropped."""
    row_of = torch.full_like(owner, -1)
    row_of[index] = torch.arange(index.numel(), device=owner.device)
    return torch.where(owner >= 0, row_of[owner.clamp_min(0)], torch.full_like(owner, -1))


def assemble(flat: torch.Tensor, owner: torch.Tensor, report: MethodReport,
             features: torch.Tensor | None = None, mixing: torch.Tensor | None = None,
             index: torch.Tensor | None = None) -> Compressed:
    """The `Compressed` of a decision.

    flat: (T*N, D) input features; owner: (T*N,) flat index of the root representing each token
    (roots own themselves), -1 if dropped; features: (M, D) output rows in root order (ascending
    position; any float dtype), None for each root's own features, bit-identical. Output in flat's dtype.
    mixing: the sparse (M, T*N) map the features were computed by (`sparse_mixing`), None when each
    row is the uniform average of the tokens its root owns (pure pruning, `uniform_average`).
    index: `roots_of(owner)` if already known.
    """
    index = roots_of(owner) if index is None else index
    out = flat[index] if features is None else features.to(flat.dtype)
    report.kept = int(index.numel())
    return Compressed(features=out, index=index, assignment=rows_of(owner, index), report=report, mixing=mixing)


def uniform_average(flat: torch.Tensor, owner: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """(M, D) float32 in root order: each root's plain mean of itself and every token it owns, by
    compression's `average_components` (what `Compressed.apply` does without a mixing, bit for bit);
    a root that owns nothing comes out bit-identical. index: `roots_of(owner)` if already known."""
    index = roots_of(owner) if index is None else index
    row = rows_of(owner, index)
    count = torch.zeros(index.numel(), dtype=torch.long, device=owner.device)
    count.index_add_(0, row.clamp_min(0), (row >= 0).long())
    return average_components(flat, Collapse(row=row, roots=index, count=count))


Terms = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (output row, input token, weight), one entry each


def own_terms(where: torch.Tensor) -> Terms:
    """Terms of outputs that are tokens `where` (k,) themselves: row i = token where[i], weight 1."""
    rows = torch.arange(where.numel(), device=where.device)
    return rows, where, torch.ones(where.numel(), device=where.device)


def sparse_mixing(terms: Terms, outputs: int, inputs: int) -> torch.Tensor:
    """`Compressed.mixing` from its entries: the (outputs, inputs) float32 sparse COO matrix (coalesced,
    on the terms' device) with weight[i] at (row[i], token[i]), repeated entries summed."""
    row, token, weight = terms
    indices = torch.stack((row.long(), token.long()))
    return torch.sparse_coo_tensor(indices, weight.float(), (outputs, inputs), check_invariants=False).coalesce()


def placed_mixing(index: torch.Tensor, parts: list[tuple[torch.Tensor, Terms]], inputs: int) -> torch.Tensor:
    """`sparse_mixing` of outputs written part by part at root positions, as features are placed:
    index (M,) the roots, ascending; each part (where (k,) root positions, terms whose rows count
    0..k-1 within the part); a later part overwrites the rows it shares with earlier ones."""
    writer = torch.full((index.numel(),), -1, dtype=torch.long, device=index.device)
    rows = [torch.searchsorted(index, where) for where, _ in parts]
    for p, at in enumerate(rows):
        writer[at] = p
    entries = []
    for p, (at, (_, (row, token, weight))) in enumerate(zip(rows, parts)):
        out_row = at[row]
        last = writer[out_row] == p
        entries.append((out_row[last], token[last], weight.float()[last]))
    return sparse_mixing(tuple(torch.cat(e) for e in zip(*entries)), index.numel(), inputs)


def spread_frames(terms: Terms, first: torch.Tensor, length: torch.Tensor, tokens: int) -> Terms:
    """Terms on window means -> terms on tokens: an entry (row, position n, weight) of window w (whose
    mean is over frames first[w] .. first[w] + length[w] - 1) becomes weight / length[w] on token
    t*N + n of each of those frames. terms' token entries here are (window, position) pairs given as
    window * N + position."""
    row, token, weight = terms
    window, position = token // tokens, token % tokens
    span = length[window]
    start = torch.cumsum(span, 0) - span
    step = torch.arange(int(span.sum()), device=row.device) - start.repeat_interleave(span)
    frame = first[window].repeat_interleave(span) + step
    return (row.repeat_interleave(span), frame * tokens + position.repeat_interleave(span),
            (weight.float() / span.float()).repeat_interleave(span))


def joined_mean(flat: torch.Tensor, owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean of the tokens each root owns besides itself (M, D) float32, their count (M,)), in root
    order; zero where a root owns nothing."""
    index = roots_of(owner)
    row = rows_of(owner, index)
    node = torch.arange(owner.numel(), device=owner.device)
    joined = (row >= 0) & (owner != node)
    total = torch.zeros(index.numel(), flat.shape[1], dtype=torch.float32, device=flat.device)
    total.index_add_(0, row[joined], flat[joined].float())
    count = torch.zeros(index.numel(), dtype=torch.long, device=owner.device)
    count.index_add_(0, row[joined], torch.ones_like(row[joined]))
    return total / count.clamp_min(1).unsqueeze(-1), count
