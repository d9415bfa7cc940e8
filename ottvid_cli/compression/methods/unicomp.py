"""UniComp (official code `TimeMarker-LLM/UniComp`, unicomp/llava_arch.py): frame group fusion,
uniqueness-driven token allocation over the fused frames, and spatial dynamic compression (SDC)
inside each fused frame. See docs/methods.md ("unicomp") for every decision.

Signals (optional): signals["frame_features"] (T, D'), SigLIP's pooled head output per frame, is the
global frame feature of the allocation, as the official reads it; without it each frame's mean token
stands in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..spatial import gram_cosine
from ..types import Compressed
from .common import (assemble, check_flags, check_inputs, check_ratio, identity, new_report, signal,
                     sparse_mixing, spread_frames)
from .holitom import Timer
from .registry import register


@dataclass(frozen=True)
class UniCompConfig:
    """UniComp; defaults are the official LLaVA-OneVision ones (unicomp/main.py and
    scripts/eval_ov-7b_unicomp.sh: Uf 0.005, Uc 0.2; the scripts run RETAIN_RATIO 0.1).

    ratio: retention r in (0, 1] (RETAIN_RATIO).
    uf: frame uniqueness; a frame joins the current group while 1 - cos(its mean feature, the
        group's first frame's) <= uf and the group is not longer than int(1 / r) + 1 frames (Uf, 0.005).
    uc: spatial uniqueness; tokens i, j of a fused frame are similar when 1 - cos(i, j) < uc (Uc, 0.2).
    exact: return exactly max(1, round(r T N)) tokens (see docs: the allocation apportions the
        target with redistribution, frames short of tokens pass their share on, and if the selection
        still falls short the next most unique tokens fill in); False keeps the official counts
        (int(r T N) allocated by floor, e.g. 400 of 410 at 16 x 256, r 0.1).
    """

    ratio: float = 0.1
    uf: float = 0.005
    uc: float = 0.2
    exact: bool = True

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact)
        if not 0 <= self.uf <= 2:
            raise ValueError(f"unicomp: uf is a cosine distance in [0, 2], got {self.uf!r}")
        if not 0 <= self.uc <= 2:
            raise ValueError(f"unicomp: uc is a cosine distance in [0, 2], got {self.uc!r}")


def fuse_frames(distance: list[list[float]], uf: float, longest: int) -> list[int]:
    """Frame group fusion (llava_arch.py `frame_group_fusion`): a frame joins the open group while
    its distance to the group's *first* frame is <= uf (inclusive) and the group holds at most
    `longest` frames (the official `num <= min_interval` lets it grow to min_interval + 1).
    Returns each group's first frame. Host loop over frames (sequential by definition)."""
    starts, size = [0], 1
    for i in range(1, len(distance)):
        if distance[i][starts[-1]] <= uf and size < longest:
            size += 1
        else:
            starts.append(i)
            size = 1
    return starts


def capped_apportion(weight: torch.Tensor, total: int | torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """Integers x <= cap summing to min(total, sum cap), proportional to `weight` (> 0) where no cap
    binds (water-filling: x_i = min(cap_i, lambda w_i), then largest remainder, ties to the lower
    index). All on the device, O(P log P), no host synchronisation."""
    w = weight.double()
    cap_f = cap.double()
    total_f = torch.minimum(torch.as_tensor(total, dtype=torch.float64, device=w.device), cap_f.sum())
    order = torch.sort(cap_f / w, stable=True).indices  # the order in which the caps bind as lambda grows
    zero = torch.zeros(1, dtype=torch.float64, device=w.device)
    capped_before = torch.cat((zero, torch.cumsum(cap_f[order], 0)))
    weight_after = torch.cat((torch.flip(torch.cumsum(torch.flip(w[order], [0]), 0), [0]), zero))
    lam = (total_f - capped_before) / weight_after.clamp_min(1e-300)  # lambda when the first k are capped
    fits = torch.cat((lam[:-1] * w[order] <= cap_f[order], torch.ones(1, dtype=torch.bool, device=w.device)))
    k = torch.argmax(fits.long())  # the fewest capped entries that leave the next one under its cap
    share = torch.minimum(cap_f, lam[k] * w)
    base = torch.minimum(torch.floor(share + 1e-9), cap_f)
    extra = (total_f - base.sum()).round().long()
    remainder = torch.where(base < cap_f, share - base, torch.full_like(share, -1.0))
    rank = torch.empty_like(order).scatter_(0, torch.sort(remainder, descending=True, stable=True).indices,
                                            torch.arange(w.numel(), device=w.device))
    return (base + (rank < extra).double()).long()


def official_allocation(uniques: torch.Tensor, max_tokens: int, cap: int) -> torch.Tensor:
    """llava_arch.py `token_allocation`, its loop on the device: floor(softmax(uniques) * max_tokens),
    frames above `cap` capped; only while some frame exceeds the cap is the leftover spread evenly
    (integer division) over the frames that did not just exceed it. The state freezes once the
    official loop would stop; the host checks that every 16 iterations."""
    frames = uniques.shape[0]
    tpf = torch.floor(torch.softmax(uniques, -1) * max_tokens).long()
    mask = tpf > cap
    tpf = torch.where(mask, torch.full_like(tpf, cap), tpf)
    avg = (max_tokens - tpf.sum()).clamp_min(0) // (~mask).sum().clamp_min(1)
    going = mask.any() & (avg > 0)
    for step in range(10 * frames + 64):
        add = torch.where(~mask & going, avg, torch.zeros_like(avg))
        tpf = tpf + add
        new_mask = tpf > cap
        tpf = torch.where(new_mask, torch.full_like(tpf, cap), tpf)
        mask = torch.where(going, new_mask, mask)
        avg = torch.where(going, (max_tokens - tpf.sum()).clamp_min(0) // (~mask).sum().clamp_min(1), avg)
        going = going & mask.any() & (avg > 0)
        if step % 16 == 15 and not bool(going):
            break
    return tpf


def sdc_select(similar: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Spatial dynamic compression's selection (llava_arch.py `spatial_dynamic_compression`, whose
    commented loop is the specification): in uniqueness order, a token is selected unless a selected
    token before it is similar to it. Batched over frames as a fixed point: a token is decided once
    every earlier similar token is (removed if one of them is selected, selected if none). Each round
    decides at least the earliest undecided token; the host checks for the end every 4 rounds.
    similar (F, N, N) bool; rank (F, N) position in uniqueness order. Returns (F, N) bool."""
    frames, tokens, _ = similar.shape
    before = similar & (rank.unsqueeze(-1) < rank.unsqueeze(1))  # [a, b]: a earlier and similar to b
    before.diagonal(dim1=1, dim2=2).fill_(False)
    edges = before.float()
    selected = torch.zeros(frames, tokens, dtype=torch.bool, device=similar.device)
    removed = torch.zeros_like(selected)
    for step in range(tokens):
        covered = torch.bmm(selected.float().unsqueeze(1), edges).squeeze(1) > 0
        open_before = torch.bmm((~removed).float().unsqueeze(1), edges).squeeze(1) > 0
        undecided = ~selected & ~removed
        removed = removed | (undecided & covered)
        selected = selected | (undecided & ~covered & ~open_before)
        if step % 4 == 3 and not bool((~selected & ~removed).any()):
            break
    return selected


def first_ranks(mask: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(F, N) bool: the first counts[f] tokens of `mask` in each frame's `order`."""
    in_order = mask.gather(1, order)
    take = in_order & (torch.cumsum(in_order.long(), 1) <= counts.unsqueeze(-1))
    return torch.zeros_like(mask).scatter_(1, order, take)


@register("unicomp", UniCompConfig,
          "UniComp: frame group fusion, uniqueness token allocation, spatial dynamic compression")
def unicomp(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
            config: UniCompConfig, signals: dict[str, Any] | None = None) -> Compressed:
    """UniComp on `config`; `signals["frame_features"]` (T, D') is the global frame feature of the
    allocation where given (`frame_global_features`), else each frame's mean token."""
    groups, tokens, _ = check_inputs(features, saliency, grid)
    dim, device = features.shape[-1], features.device
    total = groups * tokens
    report = new_report("unicomp", groups, tokens, config)
    frame_features = signal(signals, "frame_features", (groups, None), device)
    used = _signals_used(signals, frame_features is not None)
    if config.ratio >= 1.0:  # keep everything (the official code would still merge; see docs)
        out = identity(features, report)
        out.report.details = {"signals": used}
        return out
    target = report.M
    timer = Timer()
    x = features.float()

    # 1. Frame group fusion on the per-frame token means (one (T, T) transfer, host loop over frames).
    frame_mean = x.mean(1)
    means = torch.nn.functional.normalize(frame_mean, dim=-1)
    distance = (1 - means @ means.T).tolist()
    starts = fuse_frames(distance, config.uf, int(1 / config.ratio) + 1)
    short = config.exact and len(starts) * tokens < target
    if short:  # exact: cap the groups so that the fused frames hold at least the target
        starts = fuse_frames(distance, config.uf, groups // math.ceil(target / tokens))
    fused_n = len(starts)
    lengths = torch.tensor([b - a for a, b in zip(starts, starts[1:] + [groups])], device=device)
    group_of = torch.repeat_interleave(torch.arange(fused_n, device=device), lengths)
    first = torch.tensor(starts, device=device)
    if fused_n == groups:  # no frame fused: no copy
        fused = x
    else:
        fused = torch.zeros(fused_n, tokens, dim, device=device).index_add_(0, group_of, x)
        fused /= lengths.view(-1, 1, 1).float()
    metric = x if fused_n == groups else x[first]  # each group's first frame
    timer.lap("fusion")

    budget = target if config.exact else int(config.ratio * groups * tokens)
    flat = torch.arange(total, device=device).view(groups, tokens)
    root_pos = flat[first]  # (F, N): each fused token sits at its group's first frame
    details = {"groups": [int(v) for v in lengths.tolist()], "capped_groups": short, "signals": used}
    if fused_n * tokens <= budget:  # nothing to compress beyond the fusion
        owner = root_pos[group_of].reshape(-1)
        report.details = {**details, "allocation": [tokens] * fused_n}
        out = assemble(features.reshape(total, dim), owner, report, fused.reshape(-1, dim))
        report.timings_ms = timer.done()
        return out

    # 2. Token allocation over the fused frames, from the uniqueness of their global features: SigLIP's
    # pooled head output of each group's first frame (frame_global_features[selected_ids], line 268) when
    # the backbone gives it, else that frame's token mean.
    glob = torch.nn.functional.normalize((frame_mean if frame_features is None else frame_features)[first], dim=-1)
    sims = (glob @ glob.T).mean(-1)
    uniques = (sims.mean() - sims) * math.sqrt(fused_n)
    cap = min(tokens, max(1, int((budget // fused_n) * 2)))
    if config.exact:
        cap = min(tokens, max(cap, math.ceil(budget / fused_n)))
        quota = capped_apportion(torch.softmax(uniques, -1), budget, torch.full((fused_n,), cap, device=device))
    elif fused_n > budget // cap:
        quota = official_allocation(uniques, budget, cap)
    else:
        quota = torch.full((fused_n,), cap, dtype=torch.long, device=device)
    timer.lap("allocation")

    # 3. SDC: uniqueness order (ascending mean similarity), greedy selection, fusion with the
    # similar tokens. The metric is the group's first frame's features (the official keys are
    # taken at selected_ids); the fused features are what is averaged.
    sim, _ = gram_cosine(metric)
    similar = (1 - sim) < config.uc
    order = torch.sort(sim.mean(-1), dim=-1, stable=True).indices
    del sim
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(tokens, device=device).expand(fused_n, -1))
    selected = sdc_select(similar, rank)
    picked = selected.sum(-1)
    if config.exact:
        use = torch.minimum(picked, quota)
        spare = picked - use
        use = use + capped_apportion(torch.ones(fused_n, device=device), budget - use.sum(), spare)
        kept = first_ranks(selected, order, use)
        fill = capped_apportion(torch.ones(fused_n, device=device), budget - use.sum(), tokens - picked)
        kept |= first_ranks(~selected, order, fill)
    else:  # llava_arch.py:166-179
        if bool(picked.sum() > quota.sum()):
            short_frames = picked < quota
            remain = int((quota[short_frames] - picked[short_frames]).sum())
            if remain > 0:
                quota = torch.where(short_frames, quota, quota + remain // int((~short_frames).sum()))
        kept = first_ranks(selected, order, torch.minimum(picked, quota))
    timer.lap("sdc")

    # Features: 0.5 * (token + mean of every token similar to it, itself included), for kept rows only.
    count = kept.sum(-1)
    width = int(count.max())
    slot = torch.sort(kept.long(), dim=-1, descending=True, stable=True).indices[:, :width]  # kept first, ascending
    live = torch.arange(width, device=device) < count.unsqueeze(-1)
    rows = similar.gather(1, slot.unsqueeze(-1).expand(-1, -1, tokens)).float()
    blended = 0.5 * (fused.gather(1, slot.unsqueeze(-1).expand(-1, -1, dim))
                     + torch.bmm(rows, fused) / rows.sum(-1, keepdim=True).clamp_min(1))
    # Owners: a kept token owns itself; any other token the first kept token (in uniqueness order)
    # similar to it, -1 if none; every frame of a group follows its fused token.
    never = torch.full_like(similar, tokens, dtype=torch.long)
    cover_rank = torch.where(similar & kept.unsqueeze(-1), rank.unsqueeze(-1), never)
    best, by = cover_rank.min(1)
    by = torch.where(kept, torch.arange(tokens, device=device).expand(fused_n, -1), by)
    owner_fused = torch.where(kept | (best < tokens), root_pos.gather(1, by), torch.full_like(by, -1))
    owner = owner_fused[group_of].reshape(-1)
    values = blended[live]  # frame by frame, positions ascending: the root order
    # the same map as terms on the fused tokens (fused frame f, position n as f * N + n), then on
    # the frames each fused token averages
    row = (torch.cumsum(live.reshape(-1).long(), 0) - 1).view(fused_n, width)
    f, k = live.nonzero().unbind(1)
    sf, sk, sj = (rows > 0).nonzero().unbind(1)
    similar_row = live[sf, sk]
    sf, sk, sj = sf[similar_row], sk[similar_row], sj[similar_row]
    share = 0.5 / rows.sum(-1).clamp_min(1)
    terms = (torch.cat((row[f, k], row[sf, sk])), torch.cat((f * tokens + slot[f, k], sf * tokens + sj)),
             torch.cat((torch.full((f.numel(),), 0.5, device=device), share[sf, sk])))
    mixing = sparse_mixing(spread_frames(terms, first, lengths, tokens), int(live.sum()), total)
    report.details = {**details, "allocation": [int(v) for v in quota.tolist()],
                      "selected": [int(v) for v in picked.tolist()], "kept": [int(v) for v in count.tolist()]}
    out = assemble(features.reshape(total, dim), owner, report, values, mixing)
    timer.lap("assemble")
    report.timings_ms = timer.done()
    return out


def _signals_used(signals: dict[str, Any] | None, frame_features: bool) -> str:
    """What the report says: the signals' source (signals["source"], else "signals") when frame_features
    was used, else "fallback" (each frame's mean token)."""
    if not frame_features:
        return "fallback"
    source = (signals or {}).get("source")
    return source if isinstance(source, str) and source else "signals"
