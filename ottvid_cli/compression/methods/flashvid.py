"""FlashVID's vision-side compression (official code `Fanziyang-v/FlashVID`, flashvid/utils.py and
flashvid/token_selection.py, its Qwen2.5-VL path): dynamic segmentation of the frames, per-frame
attention-and-diversity token selection (ADTS), tree-based spatio-temporal merging (TSTM) of the
other tokens across neighbouring frames of a segment, then DPC-kNN clustering of the surviving
trees per frame. The inner-LLM FastV stage is off (expansion 1). See docs/methods.md ("flashvid").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ottvid import Compressed
from ..spatial import gram_cosine
from .common import (Terms, assemble, check_flags, check_inputs, check_ratio, identity, largest_remainder,
                     new_report, own_terms, split_evenly)
from .holitom import Timer, cluster_index, cluster_sums, dpc_knn, pairwise_distances, place
from .registry import register

SELECTIONS = ("attn_div_v2", "attn_div")


@dataclass(frozen=True)
class FlashVIDConfig:
    """FlashVID, outer stage; defaults are the official Qwen2.5-VL ones (flashvid/__init__.py `flashvid()`
    and lmms-eval/lmms_eval/models/simple/qwen2_5_vl.py, which pass the same values).

    ratio: retention r in (0, 1] (retention_ratio; 0.1 as every method here, the wrapper's default is
        0.25; every frame's budget is ceil(N r) with the inner-LLM expansion off).
    alpha: share of a frame's budget picked by ADTS, ceil(budget * alpha) (0.7).
    selection: ADTS variant, "attn_div_v2" (the wrapper's default: distances calibrated by attention
        and by event relevance, the token's dot product with the segment's mean frame feature) or
        "attn_div" (attention only).
    temporal_threshold: a non-ADTS token merges into its most similar non-ADTS token of the
        previous frame of its segment when that cosine exceeds this (0.8).
    segment_threshold: the frames are cut where the cosine of consecutive frame means is below this
        (0.9).
    min_segments: if fewer segments result, the least similar remaining transitions are cut too
        (min_segment_num, 8; only while `complementary`).
    complementary: complementary_segment (True). do_segment: segment at all (True).
    exact: return exactly max(1, round(r T N)) tokens: frame budgets split the target evenly and the
        clusters per frame are apportioned by largest remainder instead of the official ceils.
    bug_compatible: with exact=False, reproduce the official decisions: trees averaged as sum / (1 +
        direct children), single-frame segments clustering all N tokens ADTS ones included, and
        attn_div_v2 allowed to re-pick a selected token. Duplicate positions are collapsed (see docs).
    """

    ratio: float = 0.1
    alpha: float = 0.7
    selection: str = "attn_div_v2"
    temporal_threshold: float = 0.8
    segment_threshold: float = 0.9
    min_segments: int = 8
    complementary: bool = True
    do_segment: bool = True
    exact: bool = True
    bug_compatible: bool = False

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact, self.bug_compatible)
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"flashvid: alpha must be in [0, 1], got {self.alpha!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"flashvid: selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if not -1 <= self.temporal_threshold < 1:
            raise ValueError("flashvid: temporal_threshold is a cosine threshold in [-1, 1) (1 disables "
                             f"merging, which the official code divides by zero on), got {self.temporal_threshold!r}")
        if not -1 <= self.segment_threshold <= 1:
            raise ValueError(f"flashvid: segment_threshold must be in [-1, 1], got {self.segment_threshold!r}")
        if not (isinstance(self.min_segments, int) and self.min_segments >= 1):
            raise ValueError(f"flashvid: min_segments must be an integer >= 1, got {self.min_segments!r}")
        for name in ("complementary", "do_segment"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"flashvid: {name} must be True or False, got {getattr(self, name)!r}")


def segment_frames(frame_means: torch.Tensor, config: FlashVIDConfig) -> list[int]:
    """Segment lengths (DySeg, utils.py `segment` / `additional_segment`): cut where the cosine of
    consecutive frame means is below segment_threshold; while fewer than min_segments, also cut the
    least similar transitions not cut yet (ties to the earlier one). The official code may re-pick an
    existing cut there (zero-length segment, then a crash); we never do."""
    groups = frame_means.shape[0]
    if not config.do_segment or groups == 1:
        return [groups]
    unit = frame_means / frame_means.norm(dim=-1, keepdim=True)
    sims = (unit[:-1] * unit[1:]).sum(-1).tolist()
    cut = [s < config.segment_threshold for s in sims]
    need = min(config.min_segments - 1 - sum(cut), groups - 1 - sum(cut))
    if config.complementary and need > 0:
        for i in sorted((i for i in range(groups - 1) if not cut[i]), key=lambda i: (sims[i], i))[:need]:
            cut[i] = True
    bounds = [0] + [i + 1 for i in range(groups - 1) if cut[i]] + [groups]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def adts(sim: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, exclude: bool,
         masked: float = -float("inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention-and-diversity token selection (token_selection.py `attn_div_based_token_selection`),
    batched over frames. sim (T, N, N) cosines; weight (T, N) the candidate's calibration; picks
    counts[t] tokens per frame. dist[i, j] = (1 - cos(i, j)) * weight[j]; the first pick maximises the
    second smallest dist of its column (its nearest other token), each next one the smallest dist to
    the picks so far. exclude: already picked tokens score `masked` (v1 writes -1; v2 forgets, so it
    can pick a token twice). Returns (picked (T, N) bool, repeats (T,) picks that were repeats)."""
    groups, tokens, _ = sim.shape
    steps = int(counts.max()) if groups else 0
    picked = torch.zeros(groups, tokens, dtype=torch.bool, device=sim.device)
    repeats = torch.zeros(groups, dtype=torch.long, device=sim.device)
    if steps == 0:
        return picked, repeats
    dist = (1.0 - sim) * weight.unsqueeze(1)
    frames = torch.arange(groups, device=sim.device)
    pick = dist.topk(min(2, tokens), dim=1, largest=False).values[:, -1, :].argmax(-1)
    nearest = dist[frames, pick]
    for step in range(steps):
        live = step < counts
        repeats += (live & picked[frames, pick]).long()
        picked[frames[live], pick[live]] = True
        if step + 1 == steps:
            break
        score = torch.where(picked, torch.full_like(nearest, masked), nearest) if exclude else nearest
        pick = score.argmax(-1)
        nearest = torch.minimum(nearest, dist[frames, pick])
    return picked, repeats


def tstm(x: torch.Tensor, inv_norm: torch.Tensor, adts_mask: torch.Tensor, first: torch.Tensor,
         seg_of: torch.Tensor, lower: list[int], lengths: list[int], threshold: float) -> torch.Tensor:
    """Tree-based spatio-temporal merging (utils.py `spatiotemporal_compression`), all segments at
    once. Each non-ADTS token of a frame that is not its segment's first takes its most similar
    non-ADTS token of the previous frame; it merges into it when the cosine exceeds `threshold`, or,
    when that would leave a segment fewer than `lower` unmerged tokens, exceeds the segment's soft
    threshold (the (L N - lower)-th largest similarity, at least -1 + 1e-6). x (T, N, D), inv_norm
    (T, N) its inverse token norms. Returns parent (T*N,): the flat index of the token each token
    merges into, or itself."""
    groups, tokens = adts_mask.shape
    device = x.device
    best = torch.full((groups, tokens), -1.0, device=device)
    parent = torch.arange(groups * tokens, device=device).view(groups, tokens)
    if groups > 1:
        cross = torch.bmm(x[1:], x[:-1].transpose(1, 2))  # (T-1, N now, N previous) cosines
        cross.mul_(inv_norm[1:].unsqueeze(-1)).mul_(inv_norm[:-1].unsqueeze(1))
        cross.masked_fill_(adts_mask[1:].unsqueeze(-1), -1.0).masked_fill_(adts_mask[:-1].unsqueeze(1), -1.0)
        value, where = cross.max(-1)
        later = ~first[1:].unsqueeze(-1)
        best[1:] = torch.where(later, value, torch.full_like(value, -1.0))
        parent[1:] = torch.where(later, where + (parent[:-1, :1]), parent[1:])
    merge = best > threshold
    kept = torch.zeros(len(lengths), dtype=torch.long, device=device).index_add_(0, seg_of, (~merge).sum(-1))
    start = 0
    for g, (length, kept_g) in enumerate(zip(lengths, kept.tolist())):  # segments short of their lower bound
        if kept_g < lower[g]:
            take = length * tokens - lower[g]
            rows = slice(start, start + length)
            if take > 0:
                soft = max(float(best[rows].reshape(-1).topk(take).values[-1]), -1.0 + 1e-6)
                merge[rows] = best[rows] > soft
            else:
                merge[rows] = False
        start += length
    node = torch.arange(groups * tokens, device=device)
    return torch.where(merge.view(-1), parent.view(-1), node)


def cluster_terms(centre: torch.Tensor, own: torch.Tensor, rows: torch.Tensor, target: torch.Tensor,
                  size: torch.Tensor, width: int, groups: int) -> Terms:
    """The merge map of the cluster means as terms over the clusters (centre.nonzero() order): a
    token of a tree (target (T*N,): its tree's packed slot g * width + s, -1 if none) weighs
    1 / its tree's size (size (T*width,)) / its cluster's tree count, as the tree values and then their
    plain cluster means are computed. centre / own (R, width): `dpc_knn` over the trees of frames `rows`."""
    device = own.device
    cluster_of = cluster_index(centre, own)  # per tree
    trees = torch.zeros(int(centre.sum()), device=device).index_add_(
        0, cluster_of[own >= 0], torch.ones(int((own >= 0).sum()), device=device))
    slot_cluster = torch.full((groups, width), -1, dtype=torch.long, device=device)
    slot_cluster[rows] = cluster_of
    token = (target >= 0).nonzero().squeeze(1)
    cluster = slot_cluster.view(-1)[target[token]]
    token, cluster = token[cluster >= 0], cluster[cluster >= 0]
    return cluster, token, 1.0 / size.clamp_min(1)[target[token]] / trees[cluster]


@register("flashvid", FlashVIDConfig,
          "FlashVID (outer stage): DySeg segments, ADTS selection, tree-based temporal merging, DPC-kNN")
def flashvid(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
             config: FlashVIDConfig) -> Compressed:
    groups, tokens, sal = check_inputs(features, saliency, grid)
    dim, device = features.shape[-1], features.device
    total = groups * tokens
    report = new_report("flashvid", groups, tokens, config)
    if config.ratio >= 1.0:  # keep everything (the official code would still merge; see docs)
        return identity(features, report)
    timer = Timer()
    bug = config.bug_compatible
    x = features.float()
    flat_x = x.reshape(total, dim)

    # 1. Segments (DySeg) on the per-frame token means.
    lengths = segment_frames(x.mean(1), config)
    seg_of = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    first = torch.ones(groups, dtype=torch.bool, device=device)
    first[1:] = seg_of[1:] != seg_of[:-1]
    seg_frames = [list(range(s, s + n)) for s, n in zip([sum(lengths[:g]) for g in range(len(lengths))], lengths)]
    timer.lap("segment")

    # 2. Frame budgets: ceil(N r) each officially; the target split evenly when exact.
    if config.exact:
        budget = split_evenly(report.M, torch.zeros(groups)).tolist()
    else:
        budget = [math.ceil(tokens * config.ratio * 1.0)] * groups
    n_adts = [math.ceil(b * config.alpha) for b in budget]
    n_sttm = [b - a for a, b in zip(n_adts, budget)]

    # 3. ADTS per frame.
    sim, inv_norm = gram_cosine(x)
    weight = sal
    if config.selection == "attn_div_v2":  # event relevance: x . mean of the segment's frame means
        seg_mean = torch.zeros(len(lengths), dim, device=device).index_add_(0, seg_of, x.mean(1))
        seg_mean /= torch.tensor(lengths, device=device, dtype=torch.float32).unsqueeze(-1)
        weight = sal * torch.einsum("tnd,td->tn", x, seg_mean[seg_of])
    exclude = not (bug and config.selection == "attn_div_v2")
    adts_mask, repeats = adts(sim, weight, torch.tensor(n_adts, device=device), exclude,
                              masked=-1.0 if bug else -float("inf"))
    del sim
    timer.lap("adts")

    # 4. TSTM: merge trees across each segment's frames; a tree's value is its mean (officially
    # sum / (1 + direct children)).
    lower = [sum(budget[t] for t in frames) for frames in seg_frames]
    parent = tstm(x, inv_norm, adts_mask, first, seg_of, lower, lengths, config.temporal_threshold)
    root_of = parent
    for _ in range(max(max(lengths) - 1, 1).bit_length()):
        root_of = root_of[root_of]
    node = torch.arange(total, device=device)
    retained = ((root_of == node) & ~adts_mask.view(-1)).view(groups, tokens)
    if bug:  # single-frame segments cluster all N tokens, ADTS ones included (utils.py:131)
        retained |= torch.tensor([lengths[g] == 1 for g in seg_of.tolist()], device=device).unsqueeze(-1)
    # the surviving trees of each frame, packed into W slots: values (T, W, D)
    n_kept = retained.sum(-1)
    width = max(int(n_kept.max()), 1)
    slot = torch.cumsum(retained.long(), 1) - 1
    packed = torch.where(retained, slot + torch.arange(groups, device=device).unsqueeze(-1) * width,
                         torch.full_like(slot, -1)).view(-1)
    target = packed[root_of]
    into = target >= 0
    values = torch.zeros(groups * width, dim, device=device).index_add_(0, target[into], flat_x[into])
    if bug:
        merged = parent != node
        children = torch.ones(total, device=device).index_add_(0, parent[merged], merged[merged].float())
        keep = retained.view(-1)
        size = torch.ones(groups * width, device=device).index_copy_(0, packed[keep], children[keep])
    else:
        size = torch.zeros(groups * width, device=device).index_add_(0, target[into], into[into].float())
    values = (values / size.clamp_min(1).unsqueeze(-1)).view(groups, width, dim)
    position = torch.zeros(groups * width, dtype=torch.long, device=device)
    position[packed[retained.view(-1)]] = node[retained.view(-1)]
    position = position.view(groups, width)
    timer.lap("tstm")

    # 5. Clusters per frame: num_sttm * L over the segment's surviving trees, ceil per frame
    # officially, largest remainder when exact; DPC-kNN on the tree values.
    n_kept = n_kept.tolist()
    clusters = [0] * groups
    for g, frames in enumerate(seg_frames):
        other = sum(n_sttm[t] for t in frames)
        current = sum(n_kept[t] for t in frames)
        if other == 0 or current == 0:
            continue
        ratio = other / current
        if ratio >= 1.0:
            shares = [n_kept[t] for t in frames]
        elif config.exact:
            shares = largest_remainder(other, [n_kept[t] for t in frames])
        else:
            shares = [math.ceil(n_kept[t] * ratio) for t in frames]
        for t, c in zip(frames, shares):
            clusters[t] = c
    count = torch.tensor(clusters, device=device)
    rows = (count > 0).nonzero().squeeze(-1)
    flat = node.view(groups, tokens)
    owner = torch.full((total,), -1, dtype=torch.long, device=device)
    outputs = []
    duplicates = 0
    if rows.numel():
        vals = values[rows]
        valid = torch.arange(width, device=device) < torch.tensor(n_kept, device=device)[rows].unsqueeze(-1)
        centre, own = dpc_knn(pairwise_distances(vals), valid, count[rows], count[rows].clamp_max(7), order="score")
        members = own >= 0
        pos = position[rows]
        sums, sizes = cluster_sums(vals, centre, own, with_centre=True)
        means = sums / sizes.clamp_min(1).unsqueeze(-1)  # plain cluster means (utils.py:157-159)
        tree_owner = torch.full((total,), -1, dtype=torch.long, device=device)
        tree_owner[pos[members]] = pos.gather(1, own.clamp_min(0))[members]
        owner = tree_owner[root_of]
        duplicates = int((centre & adts_mask.view(-1)[pos]).sum())
        outputs.append((pos[centre], means, cluster_terms(centre, own, rows, target, size, width, groups)))
    adts_flat = flat[adts_mask]
    owner[adts_flat] = adts_flat
    # ADTS tokens keep their own features (last: wins)
    outputs.append((adts_flat, flat_x[adts_flat], own_terms(adts_flat)))
    timer.lap("cluster")

    official = sum(n_adts) + sum(clusters)
    report.details = {"segments": lengths, "budget": budget, "adts": n_adts, "clusters": clusters,
                      "merged": int((parent != node).sum()), "duplicates": duplicates,
                      "repicks": int(repeats.sum()), "official_count": official if not config.exact else None}
    values, mixing = place(owner, outputs, dim)
    out = assemble(features.reshape(total, dim), owner, report, values, mixing)
    timer.lap("assemble")
    report.timings_ms = timer.done()
    return out
