"""Spatial stage (paper Sec. 3.2, App. B.1): per-group token selection and transport mass.

Every function is batched over the T temporal groups; the only Python loop is the greedy
selection's loop over its k steps. Shapes: features (T, N, D), saliency / weights (T, N),
similarity (T, N, N), selected (T, k) token indices sorted ascending.
"""

from __future__ import annotations

import torch

from .backend import choose
from .config import SPATIALS
from .threads import serial

_NORM_EPS = 1e-8
_BLOCK_ELEMENTS = 1 << 21
_GRAM_BLOCKS = 4


def normalize_saliency(saliency: torch.Tensor) -> torch.Tensor:
    """Saliency (T, N) -> weights w (T, N) in float32 summing to 1 per group.

    A group that is all zero, or that holds a non-finite entry, becomes uniform (that group only).
    """
    s = saliency.float()
    finite = torch.isfinite(s)
    s = torch.where(finite, s, torch.zeros((), device=s.device))
    total = s.sum(-1, keepdim=True)
    bad = ~finite.all(-1, keepdim=True) | (total <= 0)
    uniform = torch.full_like(s, 1.0 / s.shape[-1])
    return torch.where(bad, uniform, s / torch.where(bad, torch.ones_like(total), total))


def inverse_norms(x: torch.Tensor) -> torch.Tensor:
    """1 / ||x_i|| over the last dim, float32 (zero rows give 1 / 1e-8, so their cosines are 0)."""
    return x.float().norm(dim=-1).clamp_min_(_NORM_EPS).reciprocal_()


def cosine_similarity(features: torch.Tensor, inv_norm: torch.Tensor | None = None) -> torch.Tensor:
    """sim(x_i, x_j) within each group: (T, N, D) -> (T, N, N), float32, symmetric, in [-1, 1]."""
    return gram_cosine(features, inv_norm)[0]


def gram_cosine(features: torch.Tensor, inv_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cosine similarities (T, N, N), inverse token norms (T, N)) from one Gram matrix per group.

    The Gram matrix of the raw features is scaled by the inverse norms (no normalised copy of the
    features); the norms are read off its diagonal unless given. Only its lower block triangle is
    multiplied out, in four row blocks (10/16 of the multiply-adds of a full product); the upper
    blocks are mirrored.
    """
    x = features.float()
    t, n, _ = x.shape
    sim = torch.empty(t, n, n, device=x.device, dtype=torch.float32)
    edges = [n * i // _GRAM_BLOCKS for i in range(_GRAM_BLOCKS + 1)] if n >= 64 else [0, n]
    for lo, hi in zip(edges[:-1], edges[1:]):
        block = torch.bmm(x[:, lo:hi], x[:, :hi].transpose(1, 2))  # on every thread; the rest, element-wise,
        with serial(x.device, sim.numel()):  # on one CPU thread (threads.py)
            sim[:, lo:hi, :hi] = block
        del block
    with serial(x.device, sim.numel()):
        for lo, hi in zip(edges[:-1], edges[1:]):
            sim[:, :lo, lo:hi] = sim[:, lo:hi, :lo].transpose(1, 2)
        if inv_norm is None:  # ||x_i||^2 = G_ii
            inv_norm = sim.diagonal(dim1=1, dim2=2).clamp_min(0.0).sqrt().clamp_min_(_NORM_EPS).reciprocal_()
        return sim.mul_(inv_norm.unsqueeze(-1)).mul_(inv_norm.unsqueeze(-2)).clamp_(-1.0, 1.0), inv_norm


def select_tokens(
    features: torch.Tensor, saliency: torch.Tensor, k: int, method: str = "coverage"
) -> torch.Tensor:
    """Keep k tokens per group; returns (T, k) indices sorted ascending.

    method "coverage" is the paper's Eq. 1 (saliency-weighted coverage, greedy); the others are
    the App. B.1 alternatives ("saliency" top-k, "divprune", "adts", "scope").
    """
    w = normalize_saliency(saliency)
    return select_from_similarity(cosine_similarity(features), w, k, method)


def select_from_similarity(
    sim: torch.Tensor, w: torch.Tensor, k: int, method: str = "coverage", backend: str | None = None
) -> torch.Tensor:
    """Selection on a precomputed similarity (T, N, N) and normalised saliency w (T, N).

    backend (see backend.py): on "triton", the greedy coverage / SCOPE loop runs as one fused
    kernel (one program per group, all k steps); the other methods are the same code either way.
    """
    n = sim.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if method not in SPATIALS:
        raise ValueError(f"spatial method must be one of {', '.join(SPATIALS)}, got {method!r}")
    if k == n:
        order = torch.arange(n, device=sim.device).expand(sim.shape[0], n)
    elif method == "saliency":
        # Top-K by saliency, ties to the lowest index (stable sort).
        order = torch.sort(w, dim=-1, descending=True, stable=True).indices[:, :k]
    elif method in ("coverage", "scope") and choose(sim.device, backend) == "triton":
        from . import kernels

        order = kernels.greedy_coverage(sim, w, k, candidate_weighted=method == "scope")
    elif method in ("coverage", "scope"):
        # Groups are independent: run them in blocks of about 8 MB of similarities, so that the
        # k passes of the greedy loop stay in cache; on the CPU, on one thread (threads.py).
        block = max(1, _BLOCK_ELEMENTS // (n * n))
        with serial(sim.device, min(block, sim.shape[0]) * n * n):
            order = torch.cat([
                _greedy_coverage(sim[i : i + block], w[i : i + block], k, candidate_weighted=method == "scope")
                for i in range(0, sim.shape[0], block)
            ])
    else:
        with serial(sim.device, sim.shape[0] * n):  # k steps over (T, N)
            order = greedy_max_min(sim, w, k, saliency_scaled=method == "adts")
    return torch.sort(order, dim=-1).values


def _greedy_coverage(sim: torch.Tensor, w: torch.Tensor, k: int, candidate_weighted: bool) -> torch.Tensor:
    """Greedy coverage maximisation, one token per step for all groups at once.

    Coverage (Eq. 1): gain(j) = sum_i w_i max(0, sim_ij - mu_i).
    SCOPE (App. B.1): gain(j) = w_j sum_i max(0, sim_ij - mu_i).
    mu_i = max_{v in S} sim(x_i, v), initialised to 0. Candidates are ranked on the gain itself,
    not on sum_i w_i max(sim_ij, mu_i), which equals it plus a constant per group: late in the
    greedy that sum is near 1 while the gains are ~1e-4, and float32 rounding of the sum would
    reorder close candidates.

    The loop keeps gap_ij = r_i max(0, sim_ij - mu_i), with r_i = w_i for coverage and 1 for SCOPE,
    so that a gain is one column sum. Choosing j raises mu_i by gap_ij / r_i, so the update
    is gap <- max(0, gap - gap[:, j]) in place (neither sim nor mu is needed in the loop).
    Already chosen tokens are excluded; ties go to the lowest index (argmax's first maximum).
    """
    t, n, _ = sim.shape
    rows = torch.arange(t, device=sim.device)
    gap = sim.clamp_min(0.0)  # max(0, sim_ij - mu_i) with mu = 0
    if not candidate_weighted:
        gap.mul_(w.unsqueeze(-1))
    chosen = torch.zeros(t, n, dtype=torch.bool, device=sim.device)
    order = torch.empty(t, k, dtype=torch.long, device=sim.device)
    for step in range(k):
        gain = gap.sum(1)
        if candidate_weighted:
            gain.mul_(w)
        gain.masked_fill_(chosen, float("-inf"))
        j = gain.argmax(-1)
        order[:, step] = j
        chosen[rows, j] = True
        if step + 1 < k:
            # r_i (mu_i' - mu_i) = r_i max(0, sim_ij - mu_i) = gap_ij
            gap.sub_(gap[rows, :, j].unsqueeze(-1)).clamp_min_(0.0)
    return order


def greedy_max_min(sim: torch.Tensor, w: torch.Tensor, k: int, saliency_scaled: bool) -> torch.Tensor:
    """Max-min farthest-point selection on cosine distance 1 - sim (App. B.1).

    DivPrune: start from the most isolated token (largest distance to its nearest other token),
    then add the token farthest from the selected set. ADTS: the candidate's distance is scaled by
    its saliency w_j, starting from the most salient token.
    """
    t, n, _ = sim.shape
    rows = torch.arange(t, device=sim.device)
    dist = (1.0 - sim).clamp_min_(0.0)
    if saliency_scaled:
        first = w.argmax(-1)
    else:
        first = _isolation(dist, torch.ones_like(w, dtype=torch.bool)).argmax(-1)
    order = torch.empty(t, k, dtype=torch.long, device=sim.device)
    chosen = torch.zeros(t, n, dtype=torch.bool, device=sim.device)
    order[:, 0] = first
    chosen[rows, first] = True
    nearest = dist[rows, first]  # distance of every token to the selected set
    for step in range(1, k):
        score = nearest * w if saliency_scaled else nearest.clone()
        score.masked_fill_(chosen, float("-inf"))
        j = score.argmax(-1)
        order[:, step] = j
        chosen[rows, j] = True
        torch.minimum(nearest, dist[rows, j], out=nearest)
    return order


def _isolation(dist: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """iso_j = min over other members k != j of dist(j, k); (T, M, M) distances -> (T, M)."""
    m = dist.shape[-1]
    eye = torch.eye(m, dtype=torch.bool, device=dist.device)
    masked = dist.masked_fill(eye | ~members.unsqueeze(1), float("inf"))
    iso = masked.min(-1).values
    return torch.where(torch.isfinite(iso), iso, torch.zeros_like(iso))


def token_mass(
    features: torch.Tensor,
    saliency: torch.Tensor,
    selected: torch.Tensor,
    tau_m: float,
    method: str = "coverage",
) -> torch.Tensor:
    """Transport mass m (T, k) of the selected tokens (Eq. 2-3, or App. B.1's per-method mass).

    Rows sum to 1; important tokens get small mass so the temporal stage keeps them.
    """
    w = normalize_saliency(saliency)
    return mass_from_similarity(cosine_similarity(features), w, selected, tau_m, method)


def mass_from_similarity(
    sim: torch.Tensor, w: torch.Tensor, selected: torch.Tensor, tau_m: float, method: str = "coverage"
) -> torch.Tensor:
    """Mass on a precomputed similarity (T, N, N), weights w (T, N) and selection (T, k)."""
    with serial(sim.device, selected.numel() * sim.shape[1]):  # small ops, on one CPU thread (threads.py)
        return _mass(sim, w, selected, tau_m, method)


def _mass(sim: torch.Tensor, w: torch.Tensor, selected: torch.Tensor, tau_m: float, method: str) -> torch.Tensor:
    t, k = selected.shape
    if k == 1:
        return torch.ones(t, 1, device=sim.device)
    index = selected.unsqueeze(1).expand(t, sim.shape[1], k)
    to_selected = sim.gather(2, index)  # (T, N, k): sim(x_i, s_k)
    if method in ("coverage", "scope"):
        top = to_selected.topk(2, dim=-1).values
        gap = (top[..., 0] - top[..., 1]).clamp_min(0.0)  # max(0, sigma_1 - sigma_2)
        best = to_selected.argmax(-1)  # k_hat(i), ties to the lowest selected index
        weight = w if method == "coverage" else torch.ones_like(w)
        # u_k = sum_{i: k_hat(i) = k} w_i max(0, sigma_1 - sigma_2)   (Eq. 2)
        score = torch.zeros(t, k, device=sim.device).scatter_add_(1, best, weight * gap)
        if method == "scope":
            score = score * w.gather(1, selected)
    elif method == "saliency":
        score = w.gather(1, selected)
    else:
        among = to_selected.gather(1, selected.unsqueeze(-1).expand(t, k, k))  # (T, k, k)
        score = _isolation((1.0 - among).clamp_min(0.0), torch.ones(t, k, dtype=torch.bool, device=sim.device))
        if method == "adts":
            score = score * w.gather(1, selected)
    return negative_softmax_mass(score, tau_m)


def negative_softmax_mass(score: torch.Tensor, tau_m: float) -> torch.Tensor:
    """Eq. 3: u~ = u / max u, m = softmax(-u~ / tau_m); a group whose scores are all 0 gets uniform mass."""
    peak = score.max(-1, keepdim=True).values
    flat = peak <= 0
    scaled = score / torch.where(flat, torch.ones_like(peak), peak)
    mass = torch.softmax(-scaled / tau_m, dim=-1)
    return torch.where(flat, torch.full_like(mass, 1.0 / score.shape[-1]), mass)
