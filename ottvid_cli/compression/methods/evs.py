"""`evs`: Efficient Video Sampling, the video token pruning vLLM applies by default
(`--video-pruning-method evs --video-pruning-rate q`).

Steps (docs/methods.md, "evs"): each token of temporal group t >= 1 scores its dissimilarity
1 - cos to the token at the same grid position in group t - 1; the first group's tokens rank
before every other token whatever their score; all T*N tokens are ranked by decreasing score
(stable: ties to the earlier flat position) and the first ones kept. Nothing is merged; neither
saliency nor the signals are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..types import Compressed
from .common import assemble, begin, check_flags, check_ratio, descending, owner_of_kept
from .registry import register, target_count


@dataclass(frozen=True)
class EVSConfig:
    """ratio: fraction of the T*N tokens kept, in (0, 1]; vLLM's pruning rate is q = 1 - ratio.
    exact: keep exactly max(1, round(ratio T N)) tokens, the head of EVS's ranking (fewer than a
    group's N tokens: the first group's first tokens in raster order); False keeps vLLM's count,
    max(N, int(T N (1 - q))): the whole first group whatever q says."""

    ratio: float = 0.1
    exact: bool = True

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact)


def pruning_rate(ratio: float) -> float:
    """vLLM's `--video-pruning-rate` q for our share kept: the fraction pruned, q = 1 - ratio."""
    return 1.0 - ratio


def vllm_count(ratio: float, groups: int, tokens: int) -> int:
    """The number of tokens vLLM's EVS keeps: max(N, int(T N (1 - q))), in vLLM's float arithmetic."""
    return max(tokens, int(groups * tokens * (1.0 - pruning_rate(ratio))))


def dissimilarity(features: torch.Tensor) -> torch.Tensor:
    """(T, N) float32: 1 - cos(x[t, n], x[t-1, n]) for t >= 1; +inf for the first group, which ranks
    first whatever the others score (they are at most 2)."""
    x = features.float()
    first = torch.full_like(x[:1, :, 0], float("inf"))
    return torch.cat([first, 1.0 - F.cosine_similarity(x[1:], x[:-1], dim=-1)])


def _count(config: EVSConfig, groups: int, tokens: int) -> int:
    """exact: the exact retention; else vLLM's own count (a pure function too)."""
    if config.exact:
        return target_count(config.ratio, groups, tokens)
    return min(groups * tokens, vllm_count(config.ratio, groups, tokens))


@register("evs", EVSConfig, "EVS (vLLM's default video pruning): drop tokens most like the previous group's, "
                            "first group kept", count=_count)
def evs(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int], config: EVSConfig,
        signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, _, report, done = begin("evs", features, saliency, grid, config)
    if done is not None:
        return done
    count = report.M if config.exact else vllm_count(config.ratio, groups, tokens)
    order = descending(dissimilarity(features).reshape(-1))  # stable: ties to the earlier position
    kept = torch.zeros(groups * tokens, dtype=torch.bool, device=features.device)
    kept[order[:count]] = True
    report.details = {"q": pruning_rate(config.ratio),
                      "per_frame": kept.reshape(groups, tokens).sum(-1).tolist()}
    return assemble(features.reshape(groups * tokens, -1), owner_of_kept(kept), report)
