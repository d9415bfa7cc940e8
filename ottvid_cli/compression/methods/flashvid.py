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

from ..spatial import gram_cosine
from ..types import Compressed
from .common import (assemble, check_flags, check_inputs, check_ratio, identity, largest_remainder,
                     new_report, own_terms, split_evenly)
from .holitom import Timer, dpc_knn, pairwise_distances, place
from .registry import register

SELECTIONS = ("attn_div_v2", "attn_div")


@dataclass(frozen=True)
class FlashVIDConfig:
    """FlashVID, outer stage; defaults are the official Qwen2.5-VL run's (scripts/qwen2_5_vl.sh, which
    produced the published Qwen2.5-VL numbers: min_segment_num 4, token_selection_method attn_div); the
    LLaVA-OneVision adapter selects the official LLaVA-OneVision run's (scripts/llava_ov.sh: 8,
    attn_div_v2, also `flashvid()`'s own defaults) through its `method_defaults`.

    ratio: retention r in (0, 1] (retention_ratio; 0.1 as every method here, the wrapper's default is
        0.25; every frame's budget is ceil(N r) with the inner-LLM expansion off).
    alpha: share of a frame's budget picked by ADTS, ceil(budget * alpha) (0.7).
    selection: ADTS variant, "attn_div" (attention only; the Qwen2.5-VL run's) or "attn_div_v2"
        (distances calibrated by attention and by event relevance, the token's dot product with the
        segment's mean frame feature; the LLaVA-OneVision run's).
    temporal_threshold: a non-ADTS token merges into its most similar non-ADTS token of the
        previous frame of its segment when that cosine exceeds this (0.8).
    segment_threshold: the frames are cut where the cosine of consecutive frame means is below this
        (0.9).
    min_segments: if fewer segments result, the least similar remaining transitions are cut too
        (min_segment_num, 4 [LLaVA-OneVision 8]; only while `complementary`).
    complementary: complementary_segment (True). do_segment: segment at all (True).
    exact: return exactly max(1, round(r T N)) tokens: frame budgets split the target evenly and the
        clusters per frame are apportioned by largest remainder instead of the official ceils.
    bug_compatible: with exact=False, reproduce the official decisions: trees averaged as sum / (1 +
        direct children), single-frame segments clustering all N tokens ADTS ones included, and
        attn_div_v2 allowed to re-pick a selected token. Duplicate positions are collapsed (see docs).
    """

    ratio: float = 0.1
    alpha: float = 0.7
    selection: str = "attn_div"
    temporal_threshold: float = 0.8
    segment_threshold: float = 0.9
    min_segments: int = 4
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
    device = sim.device
    steps = int(counts.max()) if groups else 0
    picked = torch.zeros(groups, tokens, dtype=torch.bool, device=device)
    if steps == 0:
        return picked, torch.zeros(groups, dtype=torch.long, device=device)
    dist = (1.0 - sim) * weight.unsqueeze(1)
    rows = dist.view(groups * tokens, tokens)  # row t*N + i: frame t's distances from token i
    base = torch.arange(groups, device=device) * tokens
    picks = torch.empty(steps, groups, dtype=torch.long, device=device)
    picks[0] = dist.topk(min(2, tokens), dim=1, largest=False).values[:, -1, :].argmax(-1)
    nearest = rows.index_select(0, base + picks[0])
    seen = picked.clone()  # every pick so far, also past a frame's count (those are dropped below)
    masked_score = torch.tensor(masked, device=device)
    for step in range(1, steps):
        if exclude:
            seen.view(-1)[base + picks[step - 1]] = True
            pick = torch.where(seen, masked_score, nearest).argmax(-1)
        else:
            pick = nearest.argmax(-1)
        picks[step] = pick
        if step + 1 < steps:
            torch.minimum(nearest, rows.index_select(0, base + pick), out=nearest)
    live = torch.arange(steps, device=device).unsqueeze(-1) < counts.to(device)  # (steps, T)
    picked.view(-1)[(picks + base)[live]] = True
    repeats = live.sum(0) - picked.sum(-1)  # live picks of a token picked before
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
    later = (~first).nonzero().squeeze(1)  # the frames that merge into their predecessor
    if later.numel():
        # (L, N now, N previous) cosines, one product per multi-frame segment (no product across a cut)
        cross = torch.empty(later.numel(), tokens, tokens, device=device)
        at = start = 0
        for length in lengths:
            if length > 1:
                torch.bmm(x[start + 1:start + length], x[start:start + length - 1].transpose(1, 2),
                          out=cross[at:at + length - 1])
                at += length - 1
            start += length
        cross.mul_(inv_norm[later].unsqueeze(-1)).mul_(inv_norm[later - 1].unsqueeze(1))
        cross.masked_fill_(adts_mask[later].unsqueeze(-1), -1.0).masked_fill_(adts_mask[later - 1].unsqueeze(1), -1.0)
        value, where = cross.max(-1)
        best[later] = value
        parent[later] = where + (later - 1).unsqueeze(-1) * tokens
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


def tree_values(flat_x: torch.Tensor, tree_root: torch.Tensor, target: torch.Tensor, joined: torch.Tensor,
                parent: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (K, D), size (K,)) of the K trees left by TSTM. tree_root (K,) their roots' flat indices;
    target (T*N,) each token's tree, -1 if none; joined (T*N,) the tokens that are not their tree's
    root. A tree's value is the sum of its tokens (root first, then the others in flat order, as one
    scatter-add from zero sums them) divided by its size: its token count, or with `parent` (the
    official arithmetic, bug_compatible) 1 + its root's direct children. Only the merged trees are
    summed and divided; a single token is its own value, bit for bit."""
    trees = tree_root.numel()
    values = torch.empty(trees + 1, flat_x.shape[1], device=flat_x.device)  # a spare last row takes the rest
    torch.index_select(flat_x, 0, tree_root, out=values[:trees])
    values[trees] = 0.0
    into = torch.where((target >= 0) & joined, target, torch.full_like(target, trees))
    values.index_add_(0, into, flat_x)  # reads the tokens in place (no gathered copy)
    values = values[:trees]
    if parent is None:
        size = torch.ones(trees + 1, device=flat_x.device).index_add_(
            0, into, torch.ones(into.numel(), device=flat_x.device))[:trees]
    else:
        merged = (parent != torch.arange(parent.numel(), device=parent.device)).nonzero().squeeze(1)
        children = torch.ones(parent.numel(), device=flat_x.device).index_add_(
            0, parent[merged], torch.ones(merged.numel(), device=flat_x.device))
        size = children[tree_root]
    multi = (size != 1).nonzero().squeeze(1)
    values[multi] = values[multi] / size[multi].unsqueeze(-1)
    return values, size


def width_buckets(sizes: list[int], floor: int, fill: float = 0.8) -> list[tuple[list[int], int]]:
    """Items grouped for padded batches: [(item indices ascending, padded width)], the widest first.
    An item joins the current bucket while its size is at least `fill` x the bucket's width; no
    bucket is narrower than `floor` (everything at or below it shares one)."""
    buckets: list[tuple[list[int], int]] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        if buckets and (sizes[i] >= fill * buckets[-1][1] or buckets[-1][1] <= floor):
            buckets[-1][0].append(i)
        else:
            buckets.append(([i], max(sizes[i], floor)))
    return [(sorted(items), width) for items, width in buckets]


def frame_clusters(values: torch.Tensor, n_kept: list[int], clusters: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """DPC-kNN of each frame's trees (utils.py `dpc_knn` on one frame at a time, via holitom's batched
    `dpc_knn`, centres in score order). values (K, D) the trees, frame by frame (n_kept[t] in frame t);
    clusters[t] centres in frame t (0: its trees are dropped). Frames of similar tree counts share one
    padded batch (`width_buckets`), so the distances cost about sum_t n_t^2 rather than T max_t n_t^2.
    Returns (centre (K,) bool, joins (K,): the tree id of the centre each tree joins, -1 if none)."""
    device = values.device
    starts = [0]
    for n in n_kept[:-1]:
        starts.append(starts[-1] + n)
    frames = [t for t, c in enumerate(clusters) if c > 0]
    centre = torch.zeros(values.shape[0], dtype=torch.bool, device=device)
    joins = torch.full((values.shape[0],), -1, dtype=torch.long, device=device)
    # a floor of 16 keeps every width out of the small-matrix kernels (widths 2-11 round differently)
    for items, width in width_buckets([n_kept[t] for t in frames], floor=min(16, max(n_kept))):
        batch = [frames[i] for i in items]
        first = torch.tensor([starts[t] for t in batch], device=device).unsqueeze(-1)
        n = torch.tensor([n_kept[t] for t in batch], device=device).unsqueeze(-1)
        count = torch.tensor([clusters[t] for t in batch], device=device)
        slot = torch.arange(width, device=device)
        valid = slot < n
        idx = first + torch.minimum(slot, n - 1)  # padding repeats a frame's last tree (never valid)
        own_centre, own = dpc_knn(pairwise_distances(values[idx]), valid, count, count.clamp_max(7), order="score")
        centre[idx[own_centre]] = True
        joins[idx[valid]] = idx.gather(1, own.clamp_min(0))[valid]
    return centre, joins


@register("flashvid", FlashVIDConfig,
          "FlashVID (outer stage): DySeg segments, ADTS selection, tree-based temporal merging, DPC-kNN")
def flashvid(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
             config: FlashVIDConfig, signals: dict[str, torch.Tensor] | None = None) -> Compressed:
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
    frame_means = x.mean(1)
    lengths = segment_frames(frame_means, config)
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
        seg_mean = torch.zeros(len(lengths), dim, device=device).index_add_(0, seg_of, frame_means)
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
    # the surviving trees, numbered by their root's flat index (so frame by frame)
    tree_root = retained.view(-1).nonzero().squeeze(1)
    tree_id = torch.full((total,), -1, dtype=torch.long, device=device)
    tree_id[tree_root] = torch.arange(tree_root.numel(), device=device)
    target = tree_id[root_of]  # each token's tree, -1 if none
    n_kept = torch.bincount(tree_root // tokens, minlength=groups)
    values, size = tree_values(flat_x, tree_root, target, root_of != node, parent if bug else None)
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
    flat = node.view(groups, tokens)
    owner = torch.full((total,), -1, dtype=torch.long, device=device)
    outputs = []
    duplicates = 0
    if any(clusters):
        centre, joins = frame_clusters(values, n_kept, clusters)
        cluster_of = torch.cumsum(centre.long(), 0) - 1  # centres numbered by tree
        cluster_of = torch.where(joins >= 0, cluster_of[joins.clamp_min(0)], torch.full_like(joins, -1))
        count = int(centre.sum())
        into = torch.where(joins >= 0, cluster_of, torch.full_like(cluster_of, count))  # count: a spare row
        sums = torch.zeros(count + 1, dim, device=device).index_add_(0, into, values)[:count]
        trees = torch.zeros(count + 1, device=device).index_add_(0, into, torch.ones_like(size))[:count]
        means = sums / trees.clamp_min(1).unsqueeze(-1)  # plain cluster means (utils.py:157-159)
        root_owner = torch.full((total,), -1, dtype=torch.long, device=device)
        root_owner[tree_root] = torch.where(joins >= 0, tree_root[joins.clamp_min(0)], torch.full_like(joins, -1))
        owner = root_owner[root_of]
        duplicates = int((centre & adts_mask.view(-1)[tree_root]).sum())
        token = (target >= 0).nonzero().squeeze(1)
        cluster = cluster_of[target[token]]
        token, cluster = token[cluster >= 0], cluster[cluster >= 0]
        terms = (cluster, token, 1.0 / size[target[token]] / trees[cluster])
        outputs.append((tree_root[centre], means, terms))
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
