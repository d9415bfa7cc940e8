"""`fastvid`: DySeg + STPrune with density-based anchors (FastVID, Shen et al., NeurIPS 2025), the
official Qwen2.5-VL path.

Steps (docs/methods.md):
1. DySeg: cosine of consecutive frames' mean tokens; a cut after the c - 1 least similar pairs and
   after every pair below tau; segments are the runs between cuts.
2. Budget: each segment's share of the retention (official: int(N r) per frame), a fraction d of
   it contextual (at least 1), the rest salient.
3. Inside a segment of several frames, consecutive frames with similarity >= ignore form a group;
   only a group's last frame keeps tokens. The salient share is split evenly over the groups, the
   contextual share over one anchor group in p, counted from the segment's end; per frame the
   contextual count is capped at N // 2 and the salient count at what the frame has left.
4. Per frame: the salient tokens are the most salient; the contextual anchors are the best
   density-peak tokens among the others (4 nearest neighbours, self included, on Euclidean
   distances divided by sqrt(D)).
5. DTM: for each anchor frame, every token of the segment that is neither salient nor one of that
   frame's anchors joins its most similar anchor (cosine); an anchor becomes
   w * anchor + (1 - w) * mean(joined), w = max(1 / (joined + 1), beta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ottvid import Compressed
from .common import (Terms, assemble, begin, check_flags, check_ratio, descending, largest_remainder, own_terms,
                     placed_mixing)
from .registry import register

_NEIGHBOURS = 4


@dataclass(frozen=True)
class FastVIDConfig:
    """Defaults: the official Qwen2.5-VL script (fastvid_qwen25vl/scripts/eval.sh).

    ratio: fraction of the T*N tokens kept, in (0, 1] (fastvid_retention_ratio).
    exact: keep exactly max(1, round(ratio T N)) tokens: segment budgets proportional to their
    length (largest remainder) instead of int(N ratio) per frame, and what the caps of step 3 cut
    (or the at-least-one contextual token adds) is made up for afterwards (docs/methods.md);
    False reproduces the official count.
    c: minimum number of segments, c - 1 forced cuts (DySeg_c, 8).
    tau: similarity below which consecutive frames are always cut (DySeg_tau, 0.84); -1 or less: none.
    ignore: similarity at or above which consecutive frames of a segment form one group whose last
    frame alone keeps tokens (DySeg_ignore, 0.95); above 1 no frames are grouped, below -1 all are.
    d: contextual share of a segment's budget (STPrune_d, 0.4).
    p: one anchor group every p groups (DTM_p, 4).
    beta: least weight an anchor keeps in its merge (DTM_beta, 0.6)."""

    ratio: float = 0.1
    exact: bool = True
    c: int = 8
    tau: float = 0.84
    ignore: float = 0.95
    d: float = 0.4
    p: int = 4
    beta: float = 0.6

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact)
        for name in ("c", "p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("tau", "ignore"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite cosine threshold, got {value!r}")
        for name in ("d", "beta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def frame_similarity(x: torch.Tensor) -> torch.Tensor:
    """Cosine of consecutive frames' mean tokens: (T, N, D) -> (T-1,) float32."""
    mean = x.float().mean(1)
    mean = mean / mean.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (mean[:-1] * mean[1:]).sum(-1)


def segments(sim: torch.Tensor, c: int, tau: float) -> list[int]:
    """DySeg segment lengths: cut after the min(c - 1, T - 1) least similar pairs (ties to the earliest)
    and after every pair below tau."""
    frames = sim.numel() + 1
    cut = sim < tau
    forced = min(c - 1, frames - 1)
    if forced:
        cut[torch.sort(sim, stable=True).indices[:forced]] = True
    ends = cut.nonzero().squeeze(1).tolist() + [frames - 1]
    return [b - a for a, b in zip([-1] + ends[:-1], ends)]


def groups_of(sim: list[float], ignore: float) -> list[int]:
    """Lengths of runs of consecutive frames whose similarity is >= ignore (sim: the segment's T_s - 1 pairs)."""
    lengths, run = [], 1
    for value in sim:
        if value < ignore:
            lengths.append(run)
            run = 1
        else:
            run += 1
    return lengths + [run]


def even(total: int, parts: int) -> list[int]:
    """`total` split over `parts`, the first ones taking the remainder (the official chunking)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def segment_plan(budget: int, sim: list[float], tokens: int, cfg: FastVIDConfig) -> list[tuple[int, int]]:
    """(salient, contextual) per frame of a segment with `budget` tokens (step 2-3, official rules)."""
    contextual = max(int(budget * cfg.d), 1)
    salient = budget - contextual
    if not sim:  # one frame
        return [(max(salient, 0), contextual)]
    lengths = groups_of(sim, cfg.ignore)
    groups = len(lengths)
    group_salient = even(salient, groups)
    anchors = even(contextual, math.ceil(groups / cfg.p))
    plan = []
    for j, length in enumerate(lengths):
        plan += [(0, 0)] * (length - 1)
        back = groups - 1 - j  # anchors are counted from the segment's end
        context = min(anchors[back // cfg.p], tokens // 2) if back % cfg.p == 0 else 0
        plan.append((min(group_salient[j], tokens - context), context))
    return plan


def density_anchors(x: torch.Tensor, free: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Density-peak anchors of G frames: (G, N, D), free (G, N) candidates, counts (G,) -> (G, N) bool.

    dist = ||x_i - x_j|| / sqrt(D) among the candidates; density = exp(-mean of the squared distances
    to the 4 nearest candidates, itself included); delta = distance to the nearest candidate of
    higher density, or the largest distance of the frame; score = delta * density; the top counts[g]
    scores (ties to the lowest index).
    """
    groups, n, dim = x.shape
    dist = torch.cdist(x, x) / dim**0.5
    pair = free.unsqueeze(1) & free.unsqueeze(2)
    inf = torch.tensor(float("inf"), device=x.device)
    near = dist.masked_fill(~pair, float("inf")).topk(min(_NEIGHBOURS, n), dim=-1, largest=False).values
    finite = torch.isfinite(near)
    density = torch.exp(-(near.square().where(finite, 0.0).sum(-1) / finite.sum(-1).clamp_min(1)))
    dist_max = dist.masked_fill(~pair, 0.0).flatten(1).max(-1).values
    higher = (density.unsqueeze(1) > density.unsqueeze(2)) & pair  # [g, i, j]: j denser than i
    delta = torch.minimum(dist.where(higher, inf).min(-1).values, dist_max.unsqueeze(-1))
    score = (delta * density).masked_fill(~free, float("-inf"))
    order = descending(score)
    return torch.zeros_like(free).scatter_(1, order, torch.arange(n, device=x.device) < counts.unsqueeze(-1))


def adjust(kept: torch.Tensor, salient: torch.Tensor, s: torch.Tensor, keeps: torch.Tensor, target: int) -> None:
    """Exact count, in place on the (T, N) masks: add the most salient unkept tokens (frames that already
    keep tokens first) as salient, or drop the least salient kept tokens (latest first), until `target`."""
    gap = target - int(kept.sum())
    flat_s = s.reshape(-1)
    if gap > 0:
        frame_first = keeps.unsqueeze(-1).expand_as(s).reshape(-1).float()
        order = descending(flat_s)
        order = order[descending(frame_first[order])]  # stable: frames that keep tokens first
        order = order[~kept.reshape(-1)[order]][:gap]
        kept.view(-1)[order] = True
        salient.view(-1)[order] = True
    elif gap < 0:
        order = descending(flat_s.flip(0).neg())  # ascending saliency, ties to the latest token
        order = (flat_s.numel() - 1 - order)
        order = order[kept.reshape(-1)[order]][:-gap]
        kept.view(-1)[order] = False
        salient.view(-1)[order] = False


@register("fastvid", FastVIDConfig, "FastVID: dynamic segmentation + salient / density-anchor pruning and merging")
def fastvid(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int], config: FastVIDConfig) -> Compressed:
    frames, tokens, s, report, done = begin("fastvid", features, saliency, grid, config)
    if done is not None:
        return done
    device = features.device
    x = features.float()
    sim = frame_similarity(x)
    lengths = segments(sim, config.c, config.tau)
    if config.exact:
        budgets = largest_remainder(report.M, lengths)
    else:
        budgets = [int(tokens * config.ratio) * length for length in lengths]
    sim_list = sim.tolist()
    plan, start = [], 0
    for length, budget in zip(lengths, budgets):
        plan += segment_plan(budget, sim_list[start : start + length - 1], tokens, config)
        start += length
    counts = torch.tensor(plan, dtype=torch.long, device=device).reshape(frames, 2)

    # Step 4: salient tokens, then density anchors among the rest of the anchor frames.
    order = descending(s)
    ranks = torch.arange(tokens, device=device)
    salient = torch.zeros(frames, tokens, dtype=torch.bool, device=device)
    salient.scatter_(1, order, ranks < counts[:, :1])
    anchor = torch.zeros_like(salient)
    anchor_frames = (counts[:, 1] > 0).nonzero().squeeze(1)
    if anchor_frames.numel() == frames:
        anchor = density_anchors(x, ~salient, counts[:, 1])
    elif anchor_frames.numel():
        anchor[anchor_frames] = density_anchors(x[anchor_frames], ~salient[anchor_frames], counts[anchor_frames, 1])
    kept = salient | anchor
    if config.exact:
        adjust(kept, salient, s, kept.any(-1), report.M)
        anchor &= kept

    # Step 5: merging, one segment at a time.
    flat = features.reshape(frames * tokens, -1)
    node = torch.arange(frames * tokens, device=device)
    owner = torch.where(kept.reshape(-1), node, torch.full_like(node, -1))
    merged_at, merged_rows, start = [], [], 0
    index = kept.reshape(-1).nonzero().squeeze(1)
    parts = [(index, own_terms(index))]
    for length in lengths:
        found = _merge_segment(x, salient, anchor, start, length, config.beta, owner)
        if found is not None:
            merged_at.append(found[0])
            merged_rows.append(found[1])
            parts.append((found[0], found[2]))
        start += length
    out = flat[index].float()
    if merged_at:
        at = torch.cat(merged_at)
        out[torch.searchsorted(index, at)] = torch.cat(merged_rows)
    report.details = {"segments": lengths, "per_frame": counts.tolist()}
    return assemble(flat, owner, report, features=out, mixing=placed_mixing(index, parts, frames * tokens))


def _merge_segment(x: torch.Tensor, salient: torch.Tensor, anchor: torch.Tensor, start: int, length: int,
                   beta: float, owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Terms] | None:
    """DTM of one segment (frames start .. start+length-1): (flat indices of its anchors that absorbed
    tokens, their new features float32, their merge map as terms over those anchors), or None; sets
    `owner` of its unkept tokens to the anchor they join in the anchor frame nearest in time (the
    later one on ties)."""
    tokens, dim = x.shape[1], x.shape[2]
    seg_anchor = anchor[start : start + length]
    frames_with = seg_anchor.any(-1).nonzero().squeeze(1)  # anchor frames, segment-local
    if not frames_with.numel():
        return None
    per_frame = seg_anchor[frames_with].sum(-1)
    width = int(per_frame.max())
    slots = descending(seg_anchor[frames_with].float())[:, :width]  # (F, width): anchors, ascending, padded
    valid = torch.arange(width, device=x.device) < per_frame.unsqueeze(-1)
    local = slots + frames_with.unsqueeze(-1) * tokens  # segment-local flat index of each slot
    pool = x[start : start + length].reshape(length * tokens, dim).float()
    aims = pool[local.reshape(-1)]
    aims = aims / aims.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    # most similar anchor by cosine (a token's own norm does not change its argmax), per anchor frame
    sims = (pool @ aims.T).view(-1, frames_with.numel(), width).masked_fill(~valid, float("-inf"))
    best = sims.argmax(-1)  # (L*N, F): the slot each token would join in each anchor frame
    joins = ~salient[start : start + length].reshape(-1, 1).expand(-1, frames_with.numel()).clone()
    column = torch.full((length,), -1, dtype=torch.long, device=x.device)
    column[frames_with] = torch.arange(frames_with.numel(), device=x.device)
    own = seg_anchor.reshape(-1).nonzero().squeeze(1)
    joins[own, column[own // tokens]] = False  # a frame's own anchors do not join it
    # one-hot joins (L*N, F*width): the sums of the joined tokens in one product, as the official's
    joined = torch.zeros(length * tokens, frames_with.numel(), width, device=x.device)
    joined.scatter_(2, best.unsqueeze(-1), joins.unsqueeze(-1).float())
    joined = joined.view(length * tokens, -1)
    total = joined.T @ pool
    count = joined.sum(0)
    hit = (count > 0) & valid.reshape(-1)
    weight = (1.0 / (count[hit] + 1.0)).clamp_min(beta).unsqueeze(-1)
    target = pool[local.reshape(-1)[hit]]
    rows = weight * target + (1.0 - weight) * total[hit] / count[hit].unsqueeze(-1)
    # the same map as terms: w on the anchor, (1 - w) / joined on each token that joined it
    offset = start * tokens
    member, slot = joined[:, hit].nonzero().unbind(1)
    anchors = torch.arange(weight.shape[0], device=x.device)
    terms = (torch.cat((anchors, slot)), torch.cat((local.reshape(-1)[hit], member)) + offset,
             torch.cat((weight.squeeze(1), ((1.0 - weight.squeeze(1)) / count[hit])[slot])))
    # owner of the unkept tokens: the anchor frame nearest in time, the later one on ties
    frame_of = torch.arange(length, device=x.device).repeat_interleave(tokens).unsqueeze(1)
    gap = (frames_with - frame_of).abs() * 2 - (frames_with >= frame_of).long()
    nearest = gap.argmin(-1, keepdim=True)
    choice = local.reshape(-1)[nearest * width + best.gather(1, nearest)].squeeze(1) + offset
    seg_owner = owner[offset : offset + length * tokens]
    unkept = seg_owner < 0
    seg_owner[unkept] = choice[unkept]
    return local.reshape(-1)[hit] + offset, rows, terms
