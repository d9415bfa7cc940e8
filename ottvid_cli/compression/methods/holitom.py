"""HoliTom's outer-LLM stage (Shao et al., NeurIPS 2025; official code `cokeshao/HoliTom`,
holitom/llava_arch.py): global temporal segmentation by dynamic programming, a static/dynamic
split inside each segment, then per-frame attention top-k (+ DPC-kNN for the contextual share)
on the dynamic tokens and DPC-kNN merging of the static ones. The inner-LLM merging is off, as
in the paper's outer-only results. See docs/methods.md ("holitom") for every decision.

This module also holds the batched DPC-kNN (and HoliTom's beta merge and a stage timer) that
flashvid.py uses too; the rest comes from common.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..types import Compressed
from .common import (Terms, assemble, check_flags, check_inputs, check_ratio, identity, largest_remainder,
                     new_report, own_terms, placed_mixing, roots_of, spread_frames)
from .registry import register

# ----------------------------------------------------------------------------------------------
# Shared helpers (also used by flashvid.py and unicomp.py)
# ----------------------------------------------------------------------------------------------


def pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """Euclidean distances within each batch row divided by sqrt(D), as both official DPC-kNNs use
    them: (B, L, D) float32 -> (B, L, L). Computed like torch.cdist's matrix-product path
    (|a|^2 + |b|^2 - 2 a.b, clamped, square root) in one baddbmm, about 4x faster than cdist on the
    CPU; the diagonal is exactly 0 (with k = 1 the density is read off that entry alone)."""
    sq = (x * x).sum(-1)
    d2 = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), x, x.transpose(1, 2), alpha=-2.0)
    d2.diagonal(dim1=1, dim2=2).zero_()
    return d2.clamp_min_(0.0).sqrt_().div_(math.sqrt(x.shape[-1]))


def dpc_knn(dist: torch.Tensor, valid: torch.Tensor, clusters: torch.Tensor, knn: torch.Tensor,
            order: str = "index") -> tuple[torch.Tensor, torch.Tensor]:
    """Density-peak clustering with kNN density, batched over rows with a per-row token subset.

    dist (B, L, L) pairwise distances; valid (B, L) the tokens taking part; clusters (B,) how many
    centres each row picks (<= its valid count); knn (B,) neighbours in the density (<= its valid
    count, the token itself included as the official topk does). density = exp(-mean of the knn
    squared distances); delta = distance to the nearest token of higher density (the largest
    distance of the row for the densest); centres: the `clusters` largest delta * density.
    Density ties go to the lower index (the official codes add uniform noise of 1e-6 instead);
    score ties to the lower index. Returns (centre (B, L) bool, owner (B, L) long): the centre
    each valid token joins, its nearest one, ties to the lowest centre index (`order="index"`,
    HoliTom sorts its centres first) or to the best-scored centre (`order="score"`, FlashVID keeps
    topk's order); a centre owns itself. Invalid tokens get owner -1.
    """
    rows, length, _ = dist.shape
    device = dist.device
    inf = torch.tensor(float("inf"), device=device)
    kmax = max(int(knn.max()), 1) if knn.numel() else 1
    nearest = torch.where(valid.unsqueeze(1), dist, inf).topk(min(kmax, length), dim=-1, largest=False).values
    use = torch.arange(nearest.shape[-1], device=device) < knn.view(-1, 1, 1)
    mean_sq = torch.where(use, nearest.square(), torch.zeros((), device=device)).sum(-1) / knn.clamp_min(1).view(-1, 1)
    density = torch.where(valid, torch.exp(-mean_sq), torch.full_like(mean_sq, -1.0))
    index = torch.arange(length, device=device)
    higher = (density.unsqueeze(1) > density.unsqueeze(2)) | (
        (density.unsqueeze(1) == density.unsqueeze(2)) & (index.view(1, 1, -1) < index.view(1, -1, 1)))
    higher &= valid.unsqueeze(1)
    dist_max = torch.where(valid.unsqueeze(1) & valid.unsqueeze(2), dist, torch.zeros((), device=device))
    dist_max = dist_max.flatten(1).max(-1).values.view(-1, 1, 1)
    delta = torch.where(higher, dist, dist_max).min(-1).values
    score = torch.where(valid, delta * density, torch.full_like(delta, -float("inf")))
    ranked = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(ranked).scatter_(1, ranked, index.expand(rows, -1))
    centre = (rank < clusters.view(-1, 1)) & valid
    if order == "index":
        owner = torch.where(centre.unsqueeze(1), dist, inf).argmin(-1)
    else:
        cmax = max(int(clusters.max()), 1) if clusters.numel() else 1
        cols = ranked[:, :cmax]
        to_centres = dist.gather(2, cols.unsqueeze(1).expand(rows, length, cmax))
        to_centres = torch.where(torch.arange(cmax, device=device) < clusters.view(-1, 1, 1), to_centres, inf)
        owner = cols.gather(1, to_centres.argmin(-1))
    owner = torch.where(centre, index.expand(rows, -1), owner)
    return centre, torch.where(valid & (clusters.view(-1, 1) > 0), owner, torch.full_like(owner, -1))


def cluster_index(centre: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """(B, L) the cluster each token of `dpc_knn` joined, numbered in the order of centre.nonzero(),
    -1 for the tokens that joined none."""
    rows, length = centre.shape
    cluster = torch.cumsum(centre.reshape(-1).long(), 0) - 1  # cluster number of each centre
    at = owner.clamp_min(0) + torch.arange(rows, device=owner.device).view(-1, 1) * length
    return torch.where(owner >= 0, cluster[at], torch.full_like(owner, -1))


def cluster_sums(x: torch.Tensor, centre: torch.Tensor, owner: torch.Tensor, with_centre: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of each cluster's member features (C, D), member counts (C,)) for the C centres of
    `dpc_knn`, in the order of centre.nonzero(); with_centre: whether the centre counts as a member.
    x (B, L, D)."""
    dim = x.shape[-1]
    centre_flat = centre.reshape(-1)
    member = (owner >= 0).reshape(-1)
    if not with_centre:
        member &= ~centre_flat
    target = cluster_index(centre, owner).reshape(-1)[member]
    sums = torch.zeros(int(centre_flat.sum()), dim, device=x.device).index_add_(0, target, x.reshape(-1, dim)[member])
    counts = torch.zeros(sums.shape[0], device=x.device).index_add_(0, target, member[member].float())
    return sums, counts


def beta_merge(x: torch.Tensor, centre: torch.Tensor, owner: torch.Tensor, beta: float) -> torch.Tensor:
    """HoliTom's cluster feature (merge_tokens_by_clustering): beta * centre + (1 - beta) * mean of the
    other members, or the centre alone when nothing joined it. x (B, L, D), centre / owner from
    `dpc_knn`; returns (C, D) in the order of centre.nonzero()."""
    sums, counts = cluster_sums(x, centre, owner, with_centre=False)
    own = x[centre]
    mean = sums / counts.clamp_min(1).unsqueeze(-1)
    return torch.where(counts.unsqueeze(-1) > 0, beta * own + (1 - beta) * mean, own)


def beta_terms(centre: torch.Tensor, owner: torch.Tensor, beta: float) -> Terms:
    """`beta_merge`'s map as terms: rows in the order of centre.nonzero(), tokens as flat indices
    b * L + l of x (B, L, D); beta on the centre and (1 - beta) / joined on each other member, or 1 on
    the centre alone when nothing joined it."""
    joined = ((owner >= 0) & ~centre).reshape(-1).nonzero().squeeze(1)
    of = cluster_index(centre, owner).reshape(-1)[joined]
    centres = centre.reshape(-1).nonzero().squeeze(1)
    count = torch.zeros(centres.numel(), device=of.device).index_add_(0, of, torch.ones(of.numel(), device=of.device))
    own = torch.where(count > 0, torch.full_like(count, beta), torch.ones_like(count))
    return (torch.cat((torch.arange(centres.numel(), device=owner.device), of)), torch.cat((centres, joined)),
            torch.cat((own, ((1 - beta) / count.clamp_min(1))[of])))


def place(owner: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor, Terms]],
          dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, D) float32 output rows in root order (for common.assemble) and their sparse merge map
    (`Compressed.mixing`) from (root positions (k,), features (k, D), their terms over rows 0..k-1)
    parts that together cover every root; later parts overwrite earlier ones."""
    index = roots_of(owner)
    out = torch.zeros(index.numel(), dim, device=owner.device)
    for where, values, _ in parts:
        out[torch.searchsorted(index, where)] = values.float()
    return out, placed_mixing(index, [(where, terms) for where, _, terms in parts], owner.numel())


class Timer:
    """Stage wall times in ms (CPU perf_counter; on accelerators the stages are not synchronised,
    so those numbers only bound host time)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self._last) * 1e3
        self._last = now

    def done(self) -> dict[str, float]:
        self.ms["total"] = sum(self.ms.values())
        return self.ms


# ----------------------------------------------------------------------------------------------
# HoliTom
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoliTomConfig:
    """HoliTom's outer-LLM stage; defaults are the official LLaVA-OneVision ones
    (holitom/llava_arch.py, prepare_inputs_labels_for_multimodal: the environment defaults).

    ratio: retention r in (0, 1] (RETAIN_RATIO).
    tau: a position is static in a window when every consecutive cosine there exceeds tau (T). None:
        the official run scripts' value for the ratio (`official_tau`: 0.65 at ratio <= 0.1, else 0.8;
        scripts/eval_ov-7b_holitom.sh, eval_vid-7b_holitom.sh; the code's environment default is 0.8).
    beta: static / contextual merge weight of the centre, the rest going to the mean of its
        members (BETA, 0.6; NO_BETA unset, so the weighting is on).
    d: share of each frame's dynamic budget that goes to DPC-kNN contextual tokens instead of the
        most salient ones (D, 0: the official code crashes for any d > 0, so 0 is what ran).
    k: DPC-kNN neighbours, used as min(k, clusters) (K, 7).
    max_window: longest segment the DP may form (MAX_WINDOW_SIZE, 1024).
    exact: return exactly max(1, round(r T N)) tokens (largest-remainder counts instead of the
        official ceil / round); False keeps the official counts.
    bug_compatible: reproduce the official code's failures (requires exact=False): d > 0 raises,
        as the official code crashes there; otherwise identical (no other official bug changes a
        decision).
    """

    ratio: float = 0.1
    tau: float | None = None
    beta: float = 0.6
    d: float = 0.0
    k: int = 7
    max_window: int = 1024
    exact: bool = True
    bug_compatible: bool = False

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact, self.bug_compatible)
        if self.tau is not None and (isinstance(self.tau, bool) or not -1 <= self.tau <= 1):
            raise ValueError(f"holitom: tau is a cosine threshold in [-1, 1], got {self.tau!r}")
        if not 0 <= self.beta <= 1:
            raise ValueError(f"holitom: beta must be in [0, 1], got {self.beta!r}")
        if not 0 <= self.d <= 1:
            raise ValueError(f"holitom: d must be in [0, 1], got {self.d!r}")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"holitom: k must be an integer >= 1, got {self.k!r}")
        if not (isinstance(self.max_window, int) and self.max_window >= 1):
            raise ValueError(f"holitom: max_window must be an integer >= 1, got {self.max_window!r}")
        if self.bug_compatible and self.d > 0:
            raise ValueError("holitom: the official code crashes for d > 0 (llava_arch.py:174); "
                             "use bug_compatible=False to run the intended contextual merging")


def official_tau(ratio: float) -> float:
    """HoliTom's T as its run scripts set it per retention: 0.65 at 10 % (and below), 0.8 at 15-25 %
    (scripts/eval_ov-7b_holitom.sh and eval_vid-7b_holitom.sh, `RETAIN_RATIO=0.10 T=0.65`, `0.15..0.25 T=0.80`)."""
    return 0.65 if ratio <= 0.1 + 1e-9 else 0.8


def static_runs(cos: torch.Tensor, tau: float) -> torch.Tensor:
    """run[t, n]: how many consecutive transitions t, t+1, ... at position n have cosine > tau
    ((T-1, N) -> (T-1, N) long), so position n is static over frames [s, e] iff run[s, n] >= e - s."""
    steps = cos.shape[0]
    above = cos > tau
    at = torch.arange(steps, device=cos.device).unsqueeze(-1).expand_as(cos)
    first_false = torch.where(above, torch.full_like(at, steps), at)
    first_false = torch.flip(torch.cummin(torch.flip(first_false, [0]), 0).values, [0])
    return first_false - at


def segment_dp(run: torch.Tensor, groups: int, max_window: int) -> tuple[list[tuple[int, int]], int]:
    """HoliTom's segmentation (select_static_windows): maximise the tokens removed by merging each
    static position of a window into one, sum over windows [s, e] of (e - s) * #static positions.

    The DP is over frames (host, O(T * window)); ties keep the earlier choice (single frame, then
    shorter windows), as the official strict `>`. Returns the segments and the tokens removed.
    """
    if groups == 1:
        return [(0, 0)], 0
    steps, tokens = run.shape
    hist = torch.zeros(steps, groups, dtype=torch.long, device=run.device).scatter_add_(1, run, torch.ones_like(run))
    at_least = torch.flip(torch.cumsum(torch.flip(hist, [1]), 1), [1]).tolist()  # [s][l] = #n with run >= l
    dp, prev = [0] * groups, [0] * groups
    for i in range(groups):
        best, start = (dp[i - 1] if i > 0 else 0), i
        for window in range(2, min(i + 1, max_window) + 1):
            j = i - window
            value = (dp[j] if j >= 0 else 0) + (window - 1) * at_least[j + 1][window - 1]
            if value > best:
                best, start = value, j + 1
        dp[i], prev[i] = best, start
    segments, i = [], groups - 1
    while i >= 0:
        segments.append((prev[i], i))
        i = prev[i] - 1
    return segments[::-1], dp[-1]


@register("holitom", HoliTomConfig,
          "HoliTom (outer-LLM): DP temporal segmentation, static window merging, attention top-k + DPC-kNN")
def holitom(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
            config: HoliTomConfig, signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, sal = check_inputs(features, saliency, grid)
    dim, device = features.shape[-1], features.device
    total = groups * tokens
    report = new_report("holitom", groups, tokens, config)
    if config.ratio >= 1.0:  # keep everything (the official code would still merge; see docs)
        return identity(features, report)
    target = report.M
    timer = Timer()
    x = features.float()
    tau = config.tau if config.tau is not None else official_tau(config.ratio)  # T

    # 1. Segmentation: consecutive cosines per position, static runs, DP over frames.
    if groups > 1:
        norm = x.norm(dim=-1).clamp_min(1e-12)  # as F.normalize: cos = <x, y> / (|x| |y|)
        cos = torch.einsum("tnd,tnd->tn", x[:-1], x[1:]) / (norm[:-1] * norm[1:])  # (T-1, N)
        run = static_runs(cos, tau)
    else:
        cos = torch.zeros(0, tokens, device=device)
        run = torch.zeros(0, tokens, dtype=torch.long, device=device)
    segments, reduced = segment_dp(run, groups, config.max_window)
    timer.lap("segment")

    # 2. Static / dynamic split: static iff every consecutive cosine of the window exceeds tau.
    starts = torch.tensor([s for s, _ in segments], device=device)
    lengths = torch.tensor([e - s + 1 for s, e in segments], device=device)
    seg_of = torch.repeat_interleave(torch.arange(len(segments), device=device), lengths)  # (T,)
    if groups > 1:
        run_at_start = torch.cat((run, torch.zeros(1, tokens, dtype=torch.long, device=device)))[starts]
        static = (run_at_start >= (lengths - 1).unsqueeze(-1)) & (lengths > 1).unsqueeze(-1)  # (S, N)
    else:
        static = torch.zeros(1, tokens, dtype=torch.bool, device=device)
    static_counts = static.sum(-1).tolist()
    timer.lap("split")

    # 3. Counts. Official: r' = r / ((TN - reduced) / TN), capped at 1; each frame keeps
    # ceil(dynamic * r'), each multi-frame segment round(static * r').
    official_ratio = min(config.ratio / ((total - reduced) / total), 1)
    parts = [("static", g, static_counts[g]) for g, (s, e) in enumerate(segments) if e > s]
    parts += [("dynamic", t, tokens - static_counts[g])
              for g, (s, e) in enumerate(segments) for t in range(s, e + 1)]
    official = [round(n * official_ratio) if kind == "static" else math.ceil(n * official_ratio)
                for kind, _, n in parts]
    unmerge = 0
    if not config.exact:
        counts = official
    elif total - reduced >= target:
        counts = largest_remainder(target, [n for _, _, n in parts])
    else:  # everything kept and still short: re-add single static tokens (see docs)
        counts, unmerge = [n for _, _, n in parts], target - (total - reduced)
    keep = {"static": [0] * len(segments), "dynamic": [0] * groups}
    for (kind, i, _), c in zip(parts, counts):
        keep[kind][i] = c
    dominant = torch.tensor([round(c * (1 - config.d)) for c in keep["dynamic"]], device=device)
    contextual = torch.tensor(keep["dynamic"], device=device) - dominant
    static_keep = torch.tensor(keep["static"], device=device)
    timer.lap("counts")

    owner = torch.full((total,), -1, dtype=torch.long, device=device)
    flat = torch.arange(total, device=device).view(groups, tokens)
    x_flat = x.reshape(total, dim)
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    # 4. Dynamic tokens: the most salient `dominant` per frame, DPC-kNN over the rest for `contextual`.
    dynamic = ~static[seg_of]  # (T, N)
    score = torch.where(dynamic, sal, torch.full_like(sal, -float("inf")))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(tokens, device=device).expand(groups, -1))
    chosen = (rank < dominant.unsqueeze(-1)) & dynamic
    owner[flat[chosen]] = flat[chosen]
    outputs.append((flat[chosen], x_flat[flat[chosen]], own_terms(flat[chosen])))
    if bool((contextual > 0).any()):
        rows = (contextual > 0).nonzero().squeeze(-1)
        valid = (dynamic & ~chosen)[rows]
        centre, own = dpc_knn(pairwise_distances(x[rows]), valid, contextual[rows],
                              contextual[rows].clamp_max(config.k), order="index")
        merged = beta_merge(x[rows], centre, own, config.beta)
        member = own >= 0
        owner[flat[rows][member]] = flat[rows].gather(1, own.clamp_min(0))[member]
        row, token, weight = beta_terms(centre, own, config.beta)
        outputs.append((flat[rows][centre], merged, (row, flat[rows].reshape(-1)[token], weight)))
    timer.lap("dynamic")

    # 5. Static tokens: the window mean of each static position, DPC-kNN merged per segment.
    multi = ((lengths > 1) & (static_keep > 0)).nonzero().squeeze(-1)
    if multi.numel():
        valid = static[multi]
        row_of_seg = torch.full((len(segments),), -1, dtype=torch.long, device=device)
        row_of_seg[multi] = torch.arange(multi.numel(), device=device)
        frame_row = row_of_seg[seg_of]  # (T,) row of each frame's segment, -1 if not merged
        take = (valid[frame_row.clamp_min(0)] & (frame_row >= 0).unsqueeze(-1)).view(-1)  # static tokens only
        slot = (frame_row.unsqueeze(-1) * tokens + torch.arange(tokens, device=device)).view(-1)
        mean = torch.zeros(multi.numel() * tokens, dim, device=device).index_add_(0, slot[take], x_flat[take])
        mean = mean.view(-1, tokens, dim) / lengths[multi].view(-1, 1, 1).float()  # window means (S', N, D)
        centre, own = dpc_knn(pairwise_distances(mean), valid, static_keep[multi],
                              static_keep[multi].clamp_max(config.k), order="index")
        merged = beta_merge(mean, centre, own, config.beta)
        start_flat = flat[starts[multi]]  # (S', N) flat index of the segment's first frame
        # window means: each term spread over its segment's frames
        terms = spread_frames(beta_terms(centre, own, config.beta), starts[multi], lengths[multi], tokens)
        outputs.append((start_flat[centre], merged, terms))
        # every frame of the window, at a static position, goes to its position's centre
        frame_owner = torch.full((len(segments), tokens), -1, dtype=torch.long, device=device)
        frame_owner[multi] = torch.where(own >= 0, start_flat.gather(1, own.clamp_min(0)), torch.full_like(own, -1))
        in_static = static[seg_of]
        owner[flat[in_static]] = frame_owner[seg_of][in_static]
    if unmerge:
        # exact mode with every part kept and still short: single static tokens come back on their
        # own, least similar to their predecessor first
        later = static[seg_of] & (torch.arange(groups, device=device) != starts[seg_of]).unsqueeze(-1)
        prev_cos = torch.cat((torch.ones(1, tokens, device=device), cos))
        pick = torch.where(later, prev_cos, torch.full_like(prev_cos, float("inf"))).view(-1)
        back = torch.sort(pick, stable=True).indices[:unmerge]
        owner[back] = back
        outputs.append((back, x_flat[back], own_terms(back)))
    timer.lap("static")

    report.details = {"tau": tau, "segments": [list(s) for s in segments], "reduced": int(reduced),
                      "retain_ratio": official_ratio, "static": static_counts,
                      "official_count": int(sum(official)), "unmerged": unmerge}
    values, mixing = place(owner, outputs, dim)
    out = assemble(features.reshape(total, dim), owner, report, values, mixing)
    timer.lap("assemble")
    report.timings_ms = timer.done()
    return out
