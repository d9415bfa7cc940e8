"""`topk`: the K most salient tokens of each frame (the paper's App. B.1 "Top-K" selection, alone).

Steps (docs/methods.md): split the budget over the frames (floor(M / T) each, one more for the
M mod T frames whose next-ranked token is the most salient), keep each frame's top tokens by
saliency (ties to the lowest index), drop the rest. Nothing is merged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..types import Compressed
from .common import assemble, begin, check_flags, check_ratio, descending, owner_of_kept, rank_mask, split_evenly
from .registry import register


@dataclass(frozen=True)
class TopKConfig:
    """ratio: fraction of the T*N tokens kept, in (0, 1].
    exact: keep exactly max(1, round(ratio T N)) tokens (the budget split over frames as above);
    False keeps max(1, round(ratio N)) tokens in every frame, the per-frame rounding of the paper's
    spatial stage (K = round(N r_s))."""

    ratio: float = 0.1
    exact: bool = True

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact)


def frame_counts(saliency: torch.Tensor, order: torch.Tensor, total: int) -> torch.Tensor:
    """Per-frame counts summing to `total`: floor(total / T) each, the remainder to the frames whose
    next-ranked token (rank floor(total / T)) has the largest saliency. order: (T, N) descending ranks."""
    groups, tokens = saliency.shape
    base = min(total // groups, tokens - 1)
    next_best = saliency.gather(1, order[:, base : base + 1]).squeeze(1)
    return split_evenly(total, next_best)


@register("topk", TopKConfig, "saliency top-k per frame (App. B.1 Top-K), budget split over frames")
def topk(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int], config: TopKConfig,
         signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, s, report, done = begin("topk", features, saliency, grid, config)
    if done is not None:
        return done
    order = descending(s)
    if config.exact:
        counts = frame_counts(s, order, report.M)
    else:
        counts = torch.full((groups,), min(max(1, round(config.ratio * tokens)), tokens), device=s.device)
    kept = rank_mask(order, counts).reshape(-1)
    report.details = {"per_frame": counts.tolist()}
    return assemble(features.reshape(groups * tokens, -1), owner_of_kept(kept), report)
