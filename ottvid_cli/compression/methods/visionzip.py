"""`visionzip`: dominant tokens by saliency + contextual merging, per frame (VisionZip, Yang et al.,
CVPR 2025; its video variant as run in the HoliTom repository).

Steps per frame with a budget of k tokens (docs/methods.md): d = int(k * dominant_ratio) dominant
tokens, the most salient; c = k - d contextual targets, taken from the list of the other tokens in
ascending position at a floored stride (every max(1, (N - d) // c)-th entry, the first c of them);
every remaining token joins its most similar target (cosine on the features); a contextual token is
the average of its target and the tokens that joined it. layout="official" also gives the order in
which the official one_token path feeds the rows to the LLM (`Compressed.order`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..types import Compressed
from .common import (assemble, begin, check_flags, check_ratio, descending, joined_mean, rank_mask, roots_of,
                     rows_of, sparse_mixing, uniform_average)
from .registry import register
from .topk import frame_counts


LAYOUTS = ("position", "official")


@dataclass(frozen=True)
class VisionZipConfig:
    """ratio: fraction of the T*N tokens kept, in (0, 1].
    exact: keep exactly max(1, round(ratio T N)) tokens, split over frames as topk does; False keeps
    the official tokens_per_frame (SPATIAL_TOKENS) in every frame.
    dominant_ratio: share of a frame's budget kept as dominant tokens, d = int(k * dominant_ratio)
    (official DOMINANT_RATIO, 54/64).
    tokens_per_frame: the official SPATIAL_TOKENS (exact=False only); None takes round(ratio N), at
    least 1 (the HoliTom LLaVA-OneVision scripts use 20/30/40/50 at ratio 0.10/0.15/0.20/0.25).
    grid_newline: the LLaVA-Video layout (mm_newline_position "grid"), where the official re-sorts
    the kept tokens by position; only bug_compatible changes anything with it.
    bug_compatible: the official arithmetic (needs exact=False): a contextual token is its target
    plus the mean of the joined tokens (not their average); with grid_newline, the dominant tokens'
    features are placed at positions taken in saliency order, so they land on each other's positions.
    layout: the order in which the LLM receives the rows (`Compressed.order`). "position" (None:
    ascending position); "official": the one_token layout of the official code, frame by frame
    the frame's dominant tokens then its contextual ones, each group in ascending position (with
    grid_newline the official sorts by position, so this is the position order there too)."""

    ratio: float = 0.1
    exact: bool = True
    dominant_ratio: float = 54 / 64
    tokens_per_frame: int | None = None
    grid_newline: bool = False
    bug_compatible: bool = False
    layout: str = "position"

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact, self.bug_compatible)
        if not 0.0 <= self.dominant_ratio <= 1.0:
            raise ValueError(f"dominant_ratio must be in [0, 1], got {self.dominant_ratio!r}")
        if self.tokens_per_frame is not None:
            if isinstance(self.tokens_per_frame, bool) or not isinstance(self.tokens_per_frame, int) \
                    or self.tokens_per_frame < 1:
                raise ValueError(f"tokens_per_frame must be a positive int or None, got {self.tokens_per_frame!r}")
            if self.exact:
                raise ValueError("tokens_per_frame fixes the official per-frame count: set exact=False too")
        if not isinstance(self.grid_newline, bool):
            raise ValueError(f"grid_newline must be True or False, got {self.grid_newline!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")


def split_frame(k: int, n: int, dominant_ratio: float) -> tuple[int, int, int]:
    """(dominant d, contextual c, stride) for a frame of n tokens keeping k."""
    dominant = int(k * dominant_ratio)
    contextual = k - dominant
    stride = max(1, (n - dominant) // contextual) if contextual else 1
    return dominant, contextual, stride


def zip_frames(x: torch.Tensor, s: torch.Tensor, k: int, dominant_ratio: float,
               scramble: bool, order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VisionZip on G frames that all keep k tokens (order: `descending(s)` if already known):
    (owner (G, N) frame-local, -1 dropped;
    source (G, N): for each kept position, the frame-local token whose own features it carries;
    is_dominant (G, N) bool: the dominant tokens)."""
    groups, n, _ = x.shape
    node = torch.arange(n, device=x.device).expand(groups, n)
    owner = torch.full((groups, n), -1, dtype=torch.long, device=x.device)
    source = node.clone()
    is_dominant = torch.zeros(groups, n, dtype=torch.bool, device=x.device)
    if k == 0:
        return owner, source, is_dominant
    dominant, contextual, stride = split_frame(k, n, dominant_ratio)
    order = descending(s) if order is None else order
    top = order[:, :dominant]  # saliency order
    owner.scatter_(1, top, top)
    is_dominant.scatter_(1, top, True)
    if scramble and dominant:  # official grid mode: ascending features paired with saliency-ordered positions
        source.scatter_(1, top, top.sort(-1).values)
    rest = order[:, dominant:].sort(-1).values  # non-dominant tokens, ascending position
    # target slots: every stride-th entry, the first `contextual` of them (official
    # `torch.arange(0, len, step)[:contextual_num]`); the others in order, their count known here
    target_slots = torch.arange(0, rest.shape[1], stride, device=x.device)[:contextual]
    is_other = torch.ones(rest.shape[1], dtype=torch.bool, device=x.device).index_fill_(0, target_slots, False)
    other_slots = torch.nonzero_static(is_other, size=rest.shape[1] - target_slots.numel()).squeeze(-1)
    targets, others = rest[:, target_slots], rest[:, other_slots]
    owner.scatter_(1, targets, targets)
    if others.shape[1] and contextual:  # no target (dominant_ratio 1): the others are dropped
        # most similar target by cosine; the joining token's own norm does not change its argmax,
        # so every token is scored against the unit targets in one product and the others read off
        aims = x.gather(1, targets.unsqueeze(-1).expand(-1, -1, x.shape[-1])).float()
        aims = aims / aims.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        sims = torch.bmm(x.float(), aims.transpose(1, 2))  # (G, N, c)
        best = sims.gather(1, others.unsqueeze(-1).expand(-1, -1, contextual)).argmax(-1)  # first maximum
        owner.scatter_(1, others, targets.gather(1, best))
    return owner, source, is_dominant


def official_order(index: torch.Tensor, is_dominant: torch.Tensor, tokens: int) -> torch.Tensor:
    """`Compressed.order` of the official one_token layout (HoliTom visionzip/llava_arch.py, the inner
    `visionzip`, line 180: `torch.cat([dominant_tokens, contextual_tokens], dim=1)` per frame, then
    the frames flattened in turn): frame by frame, the dominant rows then the contextual ones, each
    group in ascending position (`masked_select` keeps the dominant tokens in position order, and the
    targets are taken in position order). index (M,) ascending; is_dominant (T*N,) bool."""
    key = (index // tokens) * 2 + (~is_dominant[index]).long()
    return torch.sort(key, stable=True).indices


def bug_mixing(owner: torch.Tensor, index: torch.Tensor, own: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The official arithmetic's merge map: row m = token own[m] (its root, or under the grid
    scramble the token whose features it carries) + the mean of the count[m] tokens that joined it."""
    row = rows_of(owner, index)
    joined = (row >= 0) & (owner != torch.arange(owner.numel(), device=owner.device))
    member = joined.nonzero().squeeze(1)
    rows = torch.cat((torch.arange(index.numel(), device=owner.device), row[member]))
    weight = torch.cat((torch.ones(index.numel(), device=owner.device), 1.0 / count[row[member]].float()))
    return sparse_mixing((rows, torch.cat((own, member)), weight), index.numel(), owner.numel())


@register("visionzip", VisionZipConfig, "VisionZip (video): dominant tokens by saliency + contextual merging per frame")
def visionzip(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int],
              config: VisionZipConfig, signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, s, report, done = begin("visionzip", features, saliency, grid, config)
    official = config.layout == "official" and not config.grid_newline  # grid: the official sorts by position
    if done is not None:  # every token kept: the official k = N split, nothing merged
        if official:
            dominant = torch.full((groups,), int(tokens * config.dominant_ratio), device=s.device)
            done.order = official_order(done.index, rank_mask(descending(s), dominant).reshape(-1), tokens)
        return done
    order = descending(s)
    if config.exact:
        counts = frame_counts(s, order, report.M)
        base, extra = divmod(report.M, groups)  # split_evenly's counts: `extra` frames keep base + 1
        budgets = {k: n for k, n in ((base, groups - extra), (base + 1, extra)) if n}
    else:
        per_frame = min(config.tokens_per_frame or max(1, round(config.ratio * tokens)), tokens)
        counts = torch.full((groups,), per_frame, dtype=torch.long, device=s.device)
        budgets = {per_frame: groups}
    owner = torch.full((groups, tokens), -1, dtype=torch.long, device=s.device)
    source = torch.arange(tokens, device=s.device).repeat(groups, 1)
    is_dominant = torch.zeros(groups, tokens, dtype=torch.bool, device=s.device)
    scramble = config.bug_compatible and config.grid_newline
    for k, count in budgets.items():  # at most two distinct budgets, their frame counts known on the host
        if count == groups:
            owner, source, is_dominant = zip_frames(features, s, k, config.dominant_ratio, scramble, order)
            continue
        frames = torch.nonzero_static(counts == k, size=count).squeeze(1)
        owner[frames], source[frames], is_dominant[frames] = zip_frames(features[frames], s[frames], k,
                                                                        config.dominant_ratio, scramble, order[frames])
    offset = (torch.arange(groups, device=s.device) * tokens).unsqueeze(-1)
    owner = torch.where(owner >= 0, owner + offset, owner).reshape(-1)
    flat = features.reshape(groups * tokens, -1)
    mixing = None
    if config.bug_compatible:  # target + mean(joined)
        mean, count = joined_mean(flat, owner)
        index = roots_of(owner)
        rows = torch.where(count.unsqueeze(-1) > 0, flat[index].float() + mean, flat[index].float())
        own = index
        if scramble:  # the dominant tokens (never merged) carry another dominant token's features
            rows = torch.where(count.unsqueeze(-1) > 0, rows, flat[(source + offset).reshape(-1)[index]].float())
            own = torch.where(count > 0, index, (source + offset).reshape(-1)[index])
        mixing = bug_mixing(owner, index, own, count)
    else:
        index = roots_of(owner, size=sum(k * n for k, n in budgets.items()))  # each frame keeps its k tokens
        rows = uniform_average(flat, owner, index)
    per_frame = counts.tolist()  # the report's one host read
    report.details = {"per_frame": per_frame,
                      "dominant_contextual": {k: list(split_frame(k, tokens, config.dominant_ratio)[:2])
                                              for k in sorted(set(per_frame))}}
    out = assemble(flat, owner, report, features=rows, mixing=mixing, index=index)
    if official:
        out.order = official_order(out.index, is_dominant.reshape(-1), tokens)
    return out
