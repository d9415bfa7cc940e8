"""compress(): the OTT-Vid stages composed (paper Sec. 3), plus the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..timing import Stopwatch
from .budget import allocate_budget_rounds, uniform_budget
from .config import OTTVidConfig
from .merge import average_components, collapse, match_pairs
from .spatial import gram_cosine, inverse_norms, mass_from_similarity, normalize_saliency, select_from_similarity
from .transport import grid_positions, mixing_weight, sinkhorn_log, transport_cost, transport_difficulty


@dataclass(frozen=True)
class TokenCounts:
    """How many tokens each stage keeps for T groups of N tokens at a ratio (see docs/method.md)."""

    M: int  # target output tokens, max(1, round(ratio * T * N))
    K: int  # tokens kept per group by the spatial stage
    B_tot: int  # temporal operations (merges + prunes) over all pairs
    r_s: float
    r_t: float


def token_counts(groups: int, tokens: int, ratio: float, gamma: float) -> TokenCounts:
    """M = max(1, round(r T N)); K = clamp(round(N r_s), 1, N); B_tot = clamp(T K - M, 0, (T-1) K)."""
    r_s, r_t = ratio ** (1.0 - gamma), ratio**gamma
    m = max(1, round(ratio * groups * tokens))
    if groups == 1 or ratio >= 1.0:
        return TokenCounts(M=m, K=min(m, tokens), B_tot=0, r_s=r_s, r_t=r_t)
    k = min(max(round(tokens * r_s), 1), tokens)
    b_tot = min(max(groups * k - m, 0), (groups - 1) * k)
    return TokenCounts(M=m, K=k, B_tot=b_tot, r_s=r_s, r_t=r_t)


@dataclass
class CompressionReport:
    """What compress() did, as plain data (JSON-serialisable through `to_dict`).

    Per-pair lists (length T-1): alpha, W (transport difficulty), B (budget), merges, prunes.
    sinkhorn_error is the largest marginal error |P1 - a|_1 + |P^T1 - b|_1 over the pairs.
    timings_ms holds the wall time of each stage.
    """

    T: int
    N: int
    K: int
    M: int
    r_s: float
    r_t: float
    B_tot: int
    kept: int = 0
    alpha: list[float] = field(default_factory=list)
    W: list[float] = field(default_factory=list)
    B: list[int] = field(default_factory=list)
    merges: list[int] = field(default_factory=list)
    prunes: list[int] = field(default_factory=list)
    overflow_rounds: int = 0
    sinkhorn_iterations: int = 0
    sinkhorn_error: float = 0.0
    timings_ms: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Compressed:
    """features (M, D) in the input dtype; index (M,) flat original index t*N + n of each output
    token's root, ascending; assignment (T*N,) output row representing each input token, -1 if
    dropped; report: CompressionReport; selected (T, K) the tokens the spatial stage kept per group,
    ascending (what tells spatially from temporally pruned tokens apart)."""

    features: torch.Tensor
    index: torch.Tensor
    assignment: torch.Tensor
    report: CompressionReport
    selected: torch.Tensor | None = None  # (T, K) tokens the spatial stage kept in each group


def compress(
    features: torch.Tensor,
    saliency: torch.Tensor,
    grid: tuple[int, int],
    config: OTTVidConfig | None = None,
) -> Compressed:
    """Compress T groups of N = H*W visual tokens to about ratio * T * N tokens with OTT-Vid.

    features: (T, N, D), tokens of each group in row-major grid order; saliency: (T, N) >= 0;
    grid: (H, W). Computes in float32 whatever the input dtype; deterministic.
    """
    config = config or OTTVidConfig()
    groups, tokens = _validate(features, saliency, grid)
    counts = token_counts(groups, tokens, config.ratio, config.gamma)
    report = CompressionReport(
        T=groups, N=tokens, K=counts.K, M=counts.M, r_s=counts.r_s, r_t=counts.r_t, B_tot=counts.B_tot,
        config=config.to_dict(),
    )
    device = features.device
    flat = features.reshape(groups * tokens, -1)
    timer = Stopwatch(device, report.timings_ms)

    x = features.float()
    if config.ratio >= 1.0:
        _check_finite(inverse_norms(x), x)
        report.K, report.kept = tokens, groups * tokens
        every = torch.arange(groups * tokens, device=device)
        return Compressed(features=flat.clone(), index=every, assignment=every.clone(), report=report,
                          selected=every.view(groups, tokens).clone())

    with timer("similarity"):
        w = normalize_saliency(saliency)  # w_t,i
        sim, inv_norm = gram_cosine(x)  # sim(x_t,i, x_t,j), 1 / ||x_t,i||
        _check_finite(inv_norm, x)
    with timer("selection"):
        selected = select_from_similarity(sim, w, counts.K, config.spatial)  # S_t, (T, K)
    flat_selected = (selected + torch.arange(groups, device=device).unsqueeze(-1) * tokens).reshape(-1)

    if groups == 1:  # spatial stage only
        report.kept = counts.K
        assignment = torch.full((tokens,), -1, dtype=torch.long, device=device)
        assignment[flat_selected] = torch.arange(counts.K, device=device)
        report.timings_ms["total"] = sum(report.timings_ms.values())
        return Compressed(features=flat[flat_selected].clone(), index=flat_selected, assignment=assignment,
                          report=report, selected=selected)

    with timer("mass"):
        if config.mass == "uniform":
            mass = torch.full((groups, counts.K), 1.0 / counts.K, device=device)
        else:
            mass = mass_from_similarity(sim, w, selected, config.tau_m, config.spatial)  # m_t
        del sim
    with timer("cost"):
        alpha = mixing_weight(x, grid, config.alpha, inv_norm)  # alpha_t
        chosen = flat[flat_selected].view(groups, counts.K, -1)
        chosen_inv = inv_norm.reshape(-1)[flat_selected].view(groups, counts.K)
        cost = transport_cost(chosen, grid_positions(selected, grid), alpha, grid, chosen_inv)  # C_t
    with timer("sinkhorn"):
        plan, iterations, error = sinkhorn_log(mass[:-1], mass[1:], cost, config.eps, config.max_iter, config.tol)
        difficulty = transport_difficulty(plan, cost)  # W_t
    with timer("budget"):
        if config.budget == "uniform":
            budgets, rounds = uniform_budget(groups - 1, counts.B_tot, counts.K, device), 0
        else:
            budgets, rounds = allocate_budget_rounds(difficulty, counts.B_tot, counts.K, config.tau_b)  # B_t
    with timer("merge"):
        matching = match_pairs(plan, cost, budgets, config.tau_c)
        components = collapse(matching, groups)
        out = average_components(chosen.reshape(groups * counts.K, -1), components).to(features.dtype)
        index = flat_selected[components.roots]
        assignment = torch.full((groups * tokens,), -1, dtype=torch.long, device=device)
        assignment[flat_selected] = components.row

    report.kept = int(index.numel())
    report.alpha = alpha.tolist()
    report.W = difficulty.tolist()
    report.B = budgets.tolist()
    report.merges = matching.merged.sum(-1).tolist()
    report.prunes = matching.pruned.sum(-1).tolist()
    report.overflow_rounds = rounds
    report.sinkhorn_iterations = iterations
    report.sinkhorn_error = float(error.max())
    report.timings_ms["total"] = sum(report.timings_ms.values())
    return Compressed(features=out, index=index, assignment=assignment, report=report, selected=selected)


def _validate(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int]) -> tuple[int, int]:
    if features.dim() != 3:
        raise ValueError(f"features must be (T, N, D), got shape {tuple(features.shape)}")
    groups, tokens, dim = features.shape
    if groups < 1 or tokens < 1 or dim < 1:
        raise ValueError(f"features must have T, N, D >= 1, got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise ValueError(f"features must be floating point, got {features.dtype}")
    if tuple(saliency.shape) != (groups, tokens):
        raise ValueError(f"saliency must be (T, N) = {(groups, tokens)}, got {tuple(saliency.shape)}")
    if len(grid) != 2 or int(grid[0]) * int(grid[1]) != tokens or min(grid) < 1:
        raise ValueError(f"grid {tuple(grid)} does not hold N = {tokens} tokens")
    if bool((saliency < 0).any()):
        raise ValueError("saliency must be non-negative")
    return groups, tokens


def _check_finite(inv_norm: torch.Tensor, x: torch.Tensor) -> None:
    """Non-finite features show up as non-finite or zero inverse norms; say which problem it is."""
    if not bool(torch.isfinite(inv_norm).all() and (inv_norm > 0).all()):
        if not bool(torch.isfinite(x).all()):
            raise ValueError("features contain NaN or Inf")
        raise ValueError("features are too large for float32 cosine similarities")
