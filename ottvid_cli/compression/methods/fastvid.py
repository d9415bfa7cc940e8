"""`fastvid`: DySeg + STPrune with density-based anchors (FastVID, Shen et al., NeurIPS 2025), its
three official paths (docs/methods.md, "fastvid").

path "qwen2_5_vl" (default; the Qwen2.5-VL forward's inline block):
1. DySeg: cosine of consecutive frames' global features; a cut after the c - 1 least similar pairs
   and after every pair below tau; segments are the runs between cuts.
2. Budget: each segment's share of the retention (official: int(N r) per frame), a fraction d of
   it contextual (at least 1), the rest salient.
3. Inside a segment of several frames, consecutive frames with similarity >= ignore form a group;
   only a group's last frame keeps tokens. The salient share is split evenly over the groups, the
   contextual share over one anchor group in p, counted from the segment's end; per frame the
   contextual count is capped at N // 2 and the salient count at what the frame has left.
4. Per frame: the salient tokens are the most attended; the contextual anchors are the best
   density-peak tokens among the others (4 nearest neighbours, self included, on Euclidean
   distances divided by sqrt(D)).
5. DTM: for each anchor frame, every token of the segment that is neither salient nor one of that
   frame's anchors joins its most similar anchor (cosine); an anchor becomes
   w * anchor + (1 - w) * mean(joined), w = max(1 / (joined + 1), beta).

path "llava_onevision" (LLaVA-NeXT's Qwen2Model.forward block):
1. DySeg as above (on the SigLIP head's pooled features).
2. Every frame keeps S = R - int(R d) salient tokens, R = int(N r) (ATS); the C = int(R d)
   contextual tokens of a segment of L frames go to one frame in p counted from its end,
   C L // ceil(L / p) each.
3. Density-peak anchors among each anchor frame's non-salient tokens (as step 4 above).
4. DTM: an anchor frame with C anchors merges its own non-salient tokens, one with more every
   non-salient token of its segment; the anchors are in the pool too (each joins itself).

path "llava_video" (LLaVA-NeXT's Qwen2Model.forward block of fastvid_llavavideo): the Qwen2.5-VL
path's steps 1, 4 and 5; steps 2-3 without the grouping: a segment of L frames gets int(N r) L
tokens, int(. d) of them contextual (no minimum of 1), the rest salient; the salient ones are split
evenly over its L frames, the contextual ones over one anchor frame in p counted from its end; no
N // 2 cap (ours caps a frame's anchors at the tokens its salient ones leave).

Signals (optional): signals["attention"] (T, N) ranks the salient tokens in place of `saliency`,
signals["frame_features"] (T, D') feeds DySeg in place of the per-frame mean token.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..types import Compressed
from .common import (Terms, assemble, begin, check_flags, check_ratio, descending, largest_remainder, rank_mask,
                     signal, sparse_mixing)
from .registry import register

_NEIGHBOURS = 4
PATHS = ("qwen2_5_vl", "llava_onevision", "llava_video")


@dataclass(frozen=True)
class FastVIDConfig:
    """Defaults: the official Qwen2.5-VL script (fastvid_qwen25vl/scripts/eval.sh); the LLaVA-OneVision
    adapter sets path="llava_onevision" and tau=0.9 (fastvid_llavaonevision/scripts/eval.sh), or on a
    converted LLaVA-Video checkpoint path="llava_video" and tau=0.9 (fastvid_llavavideo/scripts/eval.sh).

    ratio: fraction of the T*N tokens kept, in (0, 1] (fastvid_retention_ratio).
    exact: keep exactly max(1, round(ratio T N)) tokens (docs/methods.md says how each path gets
    there); False reproduces the official count.
    c: minimum number of segments, c - 1 forced cuts (DySeg_c, 8).
    tau: similarity below which consecutive frames are always cut (DySeg_tau, 0.84; 0.9 on
    LLaVA-OneVision and LLaVA-Video); -1 or less: none.
    ignore: similarity at or above which consecutive frames of a segment form one group whose last
    frame alone keeps tokens (DySeg_ignore, 0.95; Qwen2.5-VL path only); above 1 no frames are
    grouped, below -1 all are.
    d: contextual share of the budget (STPrune_d, 0.4).
    p: one anchor group (frame) every p (DTM_p, 4).
    beta: least weight an anchor keeps in its merge (DTM_beta, 0.6).
    path: which official algorithm, "qwen2_5_vl", "llava_onevision" or "llava_video"."""

    ratio: float = 0.1
    exact: bool = True
    c: int = 8
    tau: float = 0.84
    ignore: float = 0.95
    d: float = 0.4
    p: int = 4
    beta: float = 0.6
    path: str = "qwen2_5_vl"

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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {self.path!r}")


# ------------------------------------------------------------------------------------------------
# DySeg and the Qwen2.5-VL plan


def frame_similarity(glob: torch.Tensor) -> torch.Tensor:
    """Cosine of consecutive frames' global features: (T, D') -> (T-1,) float32."""
    g = glob.float()
    g = g / g.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (g[:-1] * g[1:]).sum(-1)


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


def spread(salient: int, contextual: int, groups: int, p: int) -> list[tuple[int, int]]:
    """(salient, contextual) of each of `groups` groups (frames) of a segment, before any cap: the salient
    tokens split evenly, the first groups taking the remainder (frm_salient_num); the contextual ones
    over ceil(groups / p) anchor groups, one in p counted from the segment's end, the last group taking
    the largest share (temp_context_num, placed at tmp_i % p == 0, then frm_context_num.reverse())."""
    shares = even(salient, groups)
    anchors = even(contextual, math.ceil(groups / p))
    plan = []
    for j in range(groups):
        back = groups - 1 - j
        plan.append((shares[j], anchors[back // p] if back % p == 0 else 0))
    return plan


def segment_plan(budget: int, sim: list[float], tokens: int, cfg: FastVIDConfig) -> list[tuple[int, int]]:
    """Qwen2.5-VL path: (salient, contextual) per frame of a segment with `budget` tokens (steps 2-3)."""
    contextual = max(int(budget * cfg.d), 1)
    salient = budget - contextual
    if not sim:  # one frame
        return [(max(salient, 0), contextual)]
    lengths = groups_of(sim, cfg.ignore)
    plan = []
    for length, (group_salient, group_context) in zip(lengths, spread(salient, contextual, len(lengths), cfg.p)):
        plan += [(0, 0)] * (length - 1)  # only a group's last frame keeps tokens
        context = min(group_context, tokens // 2)
        plan.append((min(group_salient, tokens - context), context))
    return plan


def video_plan(budget: int, length: int, tokens: int, cfg: FastVIDConfig) -> list[tuple[int, int]]:
    """LLaVA-Video path: (salient, contextual) per frame of a segment of `length` frames with `budget`
    tokens: int(budget d) contextual (seg_context_num, no minimum), the rest salient (seg_salient_num),
    spread over every frame (`spread`; a one-frame segment's frame gets both, as the official's
    cur_seg_len == 1 branch). No grouping, no N // 2 cap; a frame's anchors are capped at the tokens
    its salient ones leave (the official topk fails past them)."""
    contextual = int(budget * cfg.d)
    plan = []
    for salient, context in spread(budget - contextual, contextual, length, cfg.p):
        salient = min(salient, tokens)
        plan.append((salient, min(context, tokens - salient)))
    return plan


def onevision_plan(lengths: list[int], tokens: int, cfg: FastVIDConfig
                   ) -> tuple[int, int, list[int], list[tuple[int, int]]]:
    """LLaVA-OneVision path, steps 2 and the DTM units: (S salient per frame, C contextual per frame,
    contextual count of each frame, merge units as (first frame, frames)). A segment whose anchor
    frames get more than C tokens is one unit (multi-frame DTM); otherwise each of its anchor frames
    is a unit of its own (single-frame DTM: modeling_qwen2.py selects those by count == C)."""
    keep = int(tokens * cfg.ratio)  # frame_retain_num
    context = int(keep * cfg.d)  # frame_context_num
    salient = keep - context  # frame_salient_num
    per_frame: list[int] = []
    units: list[tuple[int, int]] = []
    start = 0
    for length in lengths:
        share = context * length // math.ceil(length / cfg.p)  # cur_frm_context_num
        marks = [(length - 1 - i) % cfg.p == 0 for i in range(length)]  # counted from the segment's end
        per_frame += [share if mark else 0 for mark in marks]
        if share > context:
            units.append((start, length))
        elif share:
            units += [(start + i, 1) for i in range(length) if marks[i]]
        start += length
    return salient, context, per_frame, units


# ------------------------------------------------------------------------------------------------
# Density peaks


def gram(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, N, D) float32 -> (Gram matrices (G, N, N), squared norms (G, N))."""
    g = x @ x.transpose(1, 2)
    return g, g.diagonal(dim1=1, dim2=2)


def pair_distances(g: torch.Tensor, sq: torch.Tensor, dim: int) -> torch.Tensor:
    """Euclidean distances from the Gram, divided by sqrt(D) (the official `cdist / D ** 0.5`); zero
    on the diagonal."""
    d2 = (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * g).clamp_min_(0.0)
    d2.diagonal(dim1=1, dim2=2).zero_()
    return d2.sqrt_().div_(dim**0.5)


def density_scores(dist: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Density-peak scores among the `free` (G, N) tokens of each frame; -inf elsewhere.

    density = exp(-mean of the squared distances to the 4 nearest candidates, itself included);
    delta = distance to the nearest candidate of strictly higher density, or the frame's largest
    distance; score = delta * density. No random tie-break: equal densities are not "higher".
    """
    n = dist.shape[-1]
    pair = free.unsqueeze(1) & free.unsqueeze(2)
    masked = dist.masked_fill(~pair, float("inf"))
    near = masked.topk(min(_NEIGHBOURS, n), dim=-1, largest=False).values  # dist_nearest
    finite = torch.isfinite(near)
    density = torch.exp(-(near.square().where(finite, 0.0).sum(-1) / finite.sum(-1).clamp_min(1)))
    dist_max = dist.masked_fill(~pair, 0.0).flatten(1).amax(-1)
    higher = density.unsqueeze(1) > density.unsqueeze(2)  # density_mask [g, i, j]: j denser than i
    delta = masked.masked_fill_(~higher, float("inf")).amin(-1).minimum(dist_max.unsqueeze(-1))  # dist_0
    return (delta * density).masked_fill(~free, float("-inf"))  # density_score


def top_mask(score: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(G, N) bool: the counts[g] best scores of each row (ties to the lowest index)."""
    return rank_mask(descending(score), counts)


def density_anchors(x: torch.Tensor, free: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Density-peak anchors of G frames: (G, N, D), free (G, N) candidates, counts (G,) -> (G, N) bool."""
    g, sq = gram(x.float())
    return top_mask(density_scores(pair_distances(g, sq, x.shape[-1]), free), counts)


def adjust(kept: torch.Tensor, salient: torch.Tensor, s: torch.Tensor, keeps: torch.Tensor, target: int) -> None:
    """Qwen2.5-VL path, exact count, in place on the (T, N) masks: add the most salient unkept tokens
    (frames that already keep tokens first) as salient, or drop the least salient kept tokens (latest
    first), until `target`."""
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


# ------------------------------------------------------------------------------------------------
# The two paths' decisions


@dataclass
class _Decision:
    """What a path decided: salient and anchor masks (T, N), the anchor frames (F,) ascending, their
    anchors (F, W) in slot order (padded; `valid`), the DTM units (first frame, frames), the per-frame
    (salient, contextual) counts, the Gram matrices of the frames whose density was computed and the
    row of each frame in them (-1: none), and whether a frame's own anchors stay out of its merge."""

    salient: torch.Tensor
    anchor: torch.Tensor
    frames: torch.Tensor
    slots: torch.Tensor
    valid: torch.Tensor
    units: list[tuple[int, int]]
    per_frame: torch.Tensor
    gram: torch.Tensor | None
    gram_row: torch.Tensor
    exclude_own: bool


def _densities(x: torch.Tensor, frames: torch.Tensor, free: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (G, N) of `frames`' free tokens, their Gram matrices (G, N, N))."""
    xs = x if frames.numel() == x.shape[0] else x[frames]
    g, sq = gram(xs)
    return density_scores(pair_distances(g, sq, x.shape[-1]), free), g


def _slots(key: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(anchor frames (F,), their anchors (F, W) by decreasing key (ties to the lowest index), valid)."""
    frames = anchor.any(-1).nonzero().squeeze(1)
    per_frame = anchor[frames].sum(-1)
    width = int(per_frame.max()) if frames.numel() else 0
    slots = descending(key[frames].masked_fill(~anchor[frames], float("-inf")))[:, :width]
    valid = torch.arange(width, device=key.device) < per_frame.unsqueeze(-1)
    return frames, slots, valid


def _segment_path(x: torch.Tensor, score: torch.Tensor, sim: torch.Tensor, lengths: list[int], target: int,
                  cfg: FastVIDConfig) -> _Decision:
    """The Qwen2.5-VL and LLaVA-Video paths: the same per-segment budget, per-frame steps and DTM; their
    plans differ (`segment_plan`, `video_plan`)."""
    frames, tokens = score.shape
    device = x.device
    if cfg.exact:
        budgets = largest_remainder(target, lengths)
    else:
        budgets = [int(tokens * cfg.ratio) * length for length in lengths]  # frame_retain_num * cur_seg_len
    sim_list = sim.tolist()
    plan, start = [], 0
    for length, budget in zip(lengths, budgets):
        if cfg.path == "qwen2_5_vl":
            plan += segment_plan(budget, sim_list[start : start + length - 1], tokens, cfg)
        else:
            plan += video_plan(budget, length, tokens, cfg)
        start += length
    counts = torch.tensor(plan, dtype=torch.long, device=device).reshape(frames, 2)  # frm_salient_num, frm_context_num
    salient = rank_mask(descending(score), counts[:, 0])  # frm_top_indexes
    anchor = torch.zeros_like(salient)
    dense = (counts[:, 1] > 0).nonzero().squeeze(1)
    gram_row = torch.full((frames,), -1, dtype=torch.long, device=device)
    g = None
    if dense.numel():
        density, g = _densities(x, dense, ~salient[dense])
        anchor[dense] = top_mask(density, counts[dense, 1])
        gram_row[dense] = torch.arange(dense.numel(), device=device)
    kept = salient | anchor
    if cfg.exact or not bool(kept.any()):  # exact: the target; officially nothing kept (int(N r) = 0): one token
        adjust(kept, salient, score, kept.any(-1), target if cfg.exact else 1)
        anchor &= kept
    # anchors in ascending order (the official sorts them: sampled_indexs.sort(), modeling_qwen2_5_vl.py
    # line 2033, fastvid_llavavideo modeling_qwen2.py line 1008)
    order_key = -torch.arange(tokens, device=device, dtype=torch.float32).expand(frames, tokens)
    anchor_frames, slots, valid = _slots(order_key, anchor)
    units, start = [], 0
    for length in lengths:
        units.append((start, length))
        start += length
    per_frame = torch.stack((salient.sum(-1), anchor.sum(-1)), -1)
    return _Decision(salient, anchor, anchor_frames, slots, valid, units, per_frame, g, gram_row, True)


def _onevision_path(x: torch.Tensor, score: torch.Tensor, lengths: list[int], target: int,
                    cfg: FastVIDConfig) -> _Decision:
    frames, tokens = score.shape
    device = x.device
    salient_n, _, per_frame_context, units = onevision_plan(lengths, tokens, cfg)
    # the official topk would fail past the free tokens; ours caps there
    context_t = torch.tensor(per_frame_context, dtype=torch.long, device=device).clamp_max(tokens - salient_n)
    official = frames * salient_n + int(context_t.sum())
    gap = target - official if cfg.exact else max(0, 1 - official)  # gap >= 0: int() only rounds down
    order = descending(score)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(tokens, device=device).expand(frames, tokens))
    salient = rank < salient_n  # ATS: salient_indexes
    if gap > 0:
        # the extra tokens are salient: each frame's next best in turn (floor(gap / T) each, the
        # remainder to the frames whose next token scores best, ties to the earliest frame), never
        # taking a token the frame's anchors need
        extra = (rank - salient_n).reshape(-1)
        room = (tokens - salient_n - context_t).unsqueeze(-1).expand(frames, tokens).reshape(-1)
        candidates = descending(score.reshape(-1))
        candidates = candidates[torch.sort(extra[candidates], stable=True).indices]
        allowed = (extra[candidates] >= 0) & (extra[candidates] < room[candidates])
        salient.view(-1)[candidates[allowed][:gap]] = True
    anchor = torch.zeros_like(salient)
    dense = (context_t > 0).nonzero().squeeze(1)
    gram_row = torch.full((frames,), -1, dtype=torch.long, device=device)
    key = torch.zeros(frames, tokens, device=device)
    g = None
    if dense.numel():
        density, g = _densities(x, dense, ~salient[dense])
        anchor[dense] = top_mask(density, context_t[dense])
        key[dense] = density
        gram_row[dense] = torch.arange(dense.numel(), device=device)
    # anchors in the official's topk order (the slot order decides argmax ties)
    anchor_frames, slots, valid = _slots(key, anchor)
    per_frame = torch.stack((salient.sum(-1), anchor.sum(-1)), -1)
    return _Decision(salient, anchor, anchor_frames, slots, valid, units, per_frame, g, gram_row, False)


# ------------------------------------------------------------------------------------------------
# DTM


def _merge(x: torch.Tensor, dec: _Decision) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DTM's choices over every unit: (owner (T*N,) as `assemble` takes it, the joins as (member,
    anchor) flat index pairs, one per token and anchor frame of its unit that it joins).

    Each token of a unit picks its most similar anchor (cosine) in each of the unit's anchor frames:
    one product per unit of several frames; for one-frame units, batched, the similarities are the
    density's Gram entries. Its representative (`owner`) is the anchor it picks in the anchor frame
    nearest in time (the later one on ties)."""
    frames, tokens, dim = x.shape
    device = x.device
    size = frames * tokens
    flat = x.reshape(size, dim)
    kept = (dec.salient | dec.anchor).reshape(-1)
    node = torch.arange(size, device=device)
    owner = torch.where(kept, node, torch.full_like(node, -1))
    empty = torch.zeros(0, dtype=torch.long, device=device)
    anchor_frames = dec.frames.tolist()
    per_frame = dec.valid.sum(-1).tolist()
    spans = []  # (first frame, frames, first column, last column + 1) of the units that have anchors
    for start, length in dec.units:
        lo, hi = bisect.bisect_left(anchor_frames, start), bisect.bisect_left(anchor_frames, start + length)
        if lo < hi:
            spans.append((start, length, lo, hi))
    if not spans:
        return owner, empty, empty
    width = dec.slots.shape[1]
    target = (dec.frames.unsqueeze(-1) * tokens + dec.slots).reshape(-1)  # (F * W,) flat index of each slot
    aims = flat[target]
    inv_norm = aims.norm(dim=-1).clamp_min(1e-12).reciprocal()
    widest = max(hi - lo for _, _, lo, hi in spans)
    choice = torch.full((size, widest), -1, dtype=torch.long, device=device)  # per column of the token's unit
    column_frame = [[-1] * widest for _ in range(frames)]  # the anchor frame of each column, per frame
    alone = [(start, lo) for start, length, lo, hi in spans if length == 1]
    if alone:  # the one-frame units at once: their similarities are entries of the density's Gram matrices
        frame = torch.tensor([f for f, _ in alone], dtype=torch.long, device=device)
        column = torch.tensor([c for _, c in alone], dtype=torch.long, device=device)
        g = dec.gram[dec.gram_row[frame]]  # (A, N, N)
        sims = g.gather(2, dec.slots[column].unsqueeze(1).expand(-1, tokens, -1))
        sims = (sims * inv_norm.view(-1, width)[column].unsqueeze(1)).masked_fill_(
            ~dec.valid[column].unsqueeze(1), float("-inf"))
        best = sims.argmax(-1) + (column * width).unsqueeze(-1)  # (A, N)
        choice[(frame.unsqueeze(-1) * tokens + torch.arange(tokens, device=device)).reshape(-1), 0] = \
            target[best].reshape(-1)
        for f, _ in alone:
            column_frame[f][0] = f
    for start, length, lo, hi in spans:
        if length == 1:
            continue
        count = hi - lo
        used = max(per_frame[lo:hi])
        pool = flat[start * tokens : (start + length) * tokens]
        unit_aims = (aims.view(-1, width, dim)[lo:hi, :used] * inv_norm.view(-1, width)[lo:hi, :used, None])
        # one product for every anchor frame of the unit; a token's own norm does not change its argmax
        sims = (pool @ unit_aims.reshape(-1, dim).T).view(-1, count, used)
        if min(per_frame[lo:hi]) < used:
            sims.masked_fill_(~dec.valid[lo:hi, :used], float("-inf"))
        best = sims.argmax(-1) + torch.arange(lo * width, hi * width, width, device=device)
        choice[start * tokens : (start + length) * tokens, :count] = target[best]
        for f in range(start, start + length):
            column_frame[f][:count] = anchor_frames[lo:hi]
    columns = torch.tensor(column_frame, dtype=torch.long, device=device)  # (T, C)
    here = torch.arange(frames, device=device).unsqueeze(-1)
    joins = (choice >= 0) & ~dec.salient.reshape(-1, 1)
    if dec.exclude_own:  # a frame's own anchors do not join it
        joins &= ~(dec.anchor.reshape(-1, 1) & (columns == here).repeat_interleave(tokens, 0))
    # the anchor frame nearest in time, the later one on ties
    gap = torch.where(columns >= 0, (columns - here).abs() * 2 - (columns >= here).long(), size * 4)
    pick = choice.gather(1, gap.argmin(-1).repeat_interleave(tokens).unsqueeze(-1)).squeeze(-1)
    owner = torch.where(kept, owner, pick)
    return owner, node.unsqueeze(-1).expand(-1, widest)[joins], choice[joins]


def dtm_terms(member: torch.Tensor, target: torch.Tensor, index: torch.Tensor, beta: float, size: int
              ) -> tuple[torch.Tensor, Terms]:
    """DTM's merge map from the joins (member, anchor) and the kept tokens `index` (ascending): (which
    rows are merged (M,) bool, the terms of every row). A kept token that absorbed no other token is
    its own row (weight 1); an anchor that did becomes w on itself and (1 - w) / joined on each token
    that joined it (itself too where it joined itself), w = max(1 / (joined + 1), beta) (avg_weights)."""
    joined = torch.bincount(target, minlength=size)
    others = joined - torch.bincount(target[member == target], minlength=size)
    row_of = torch.full((size,), -1, dtype=torch.long, device=index.device)
    row_of[index] = torch.arange(index.numel(), device=index.device)
    merged = others[index] > 0
    weight = (1.0 / (joined.float() + 1.0)).clamp_min(beta)
    counted = merged[row_of[target]]
    share = (1.0 - weight) / joined.clamp_min(1).float()
    rows = torch.arange(index.numel(), device=index.device)
    own = torch.where(merged, weight[index], torch.ones_like(weight[index]))
    terms = (torch.cat((rows, row_of[target[counted]])), torch.cat((index, member[counted])),
             torch.cat((own, share[target[counted]])))
    return merged, terms


@register("fastvid", FastVIDConfig, "FastVID: dynamic segmentation + salient / density-anchor pruning and merging")
def fastvid(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int], config: FastVIDConfig,
            signals: dict[str, Any] | None = None) -> Compressed:
    """FastVID on `config.path`'s algorithm; `signals` "attention" and "frame_features" stand in for
    saliency and the per-frame mean token where given."""
    frames, tokens, s, report, done = begin("fastvid", features, saliency, grid, config)
    attention = signal(signals, "attention", (frames, tokens), features.device)
    glob = signal(signals, "frame_features", (frames, None), features.device)
    used = _signals_used(signals, attention is not None, glob is not None)
    if done is not None:
        done.report.details = {"path": config.path, "signals": used}
        return done
    x = features.float()
    score = attention if attention is not None else s
    sim = frame_similarity(glob if glob is not None else x.mean(1))
    lengths = segments(sim, config.c, config.tau)
    if config.path == "llava_onevision":
        dec = _onevision_path(x, score, lengths, report.M, config)
    else:
        dec = _segment_path(x, score, sim, lengths, report.M, config)
    owner, member, target = _merge(x, dec)
    size = frames * tokens
    flat = features.reshape(size, -1)
    index = (dec.salient | dec.anchor).reshape(-1).nonzero().squeeze(1)
    merged, terms = dtm_terms(member, target, index, config.beta, size)
    mixing = sparse_mixing(terms, index.numel(), size)
    out = flat[index].float()
    if bool(merged.any()):  # the weighted sums of the map's rows (coalesced: grouped by row, in order)
        row, token = mixing.indices()
        starts = torch.searchsorted(row, torch.arange(index.numel(), device=row.device))
        sums = torch.nn.functional.embedding_bag(token, x.reshape(size, -1), starts, mode="sum",
                                                 per_sample_weights=mixing.values())
        out[merged] = sums[merged]
    report.details = {"path": config.path, "segments": lengths, "per_frame": dec.per_frame.tolist(), "signals": used}
    return assemble(flat, owner, report, features=out, mixing=mixing)


def _signals_used(signals: dict[str, Any] | None, attention: bool, frame_features: bool) -> str:
    """What the report says about the signals: their source (signals["source"], else "signals") when
    both were used, "fallback" when neither was (saliency and the per-frame mean token), else which one."""
    source = (signals or {}).get("source")
    source = source if isinstance(source, str) and source else "signals"
    if attention and frame_features:
        return source
    if attention or frame_features:
        return f"{source}: {'attention' if attention else 'frame_features'} only"
    return "fallback"
