"""`vidcom2`: VidCom2 (Video Compression Commander, Liu et al., EMNLP 2025) as vLLM runs it
(`--video-pruning-method vidcom2 --video-pruning-rate q`).

Steps (docs/methods.md, "vidcom2"): (1) keep the half of the channels whose variance over all T*N
tokens is lowest and L2-normalise each token on them; (2) score each token's redundancy as the sum
of multi-scale Gaussian similarities to the video's mean token and to its frame's mean token; (3)
give each frame a budget round(N (1 - q) (1 + p_t - mean p)), at least 1 and at most N, where p is
a sharp softmax of how far the frame lies from the video's mean; (4) keep each frame's least
redundant tokens; (5) reach the exact total by dropping the most redundant kept tokens or adding
the least redundant others. Nothing is merged; neither saliency nor the signals are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..types import Compressed
from .common import assemble, begin, check_flags, check_ratio, owner_of_kept, rank_mask
from .evs import pruning_rate
from .registry import register

BANDWIDTHS = tuple(2.0 ** k for k in range(-3, 2))  # a in {1/8, 1/4, 1/2, 1, 2}: exp(-d^2 / 2a), summed
CHANNEL_SHARE = 0.5  # the lowest-variance half of the channels
TEMPERATURE = 0.01  # of the softmax over the frames' distinctiveness


@dataclass(frozen=True)
class VidCom2Config:
    """ratio: fraction of the T*N tokens kept, in (0, 1]; vLLM's pruning rate is q = 1 - ratio.
    exact: keep exactly max(1, round(ratio T N)) tokens, every frame keeping at least its least
    redundant token while that count allows (M >= T); False keeps vLLM's count max(T, int(T N (1 - q)))
    and its final adjustment, which ranks all kept tokens together and may empty a frame."""

    ratio: float = 0.1
    exact: bool = True

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact)


def vllm_count(ratio: float, groups: int, tokens: int) -> int:
    """The number of tokens vLLM's VidCom2 keeps: max(T, min(int(T N (1 - q)), T N))."""
    total = groups * tokens
    return max(groups, min(int(total * (1.0 - pruning_rate(ratio))), total))


def gaussian_similarity(x: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """sum over the bandwidths a of exp(-||x - centre||^2 / 2a): (T, N, C), (.., 1, C) -> (T, N)."""
    dist = ((x - centre) ** 2).sum(-1)
    total = torch.zeros_like(dist)
    for a in BANDWIDTHS:  # five terms, added in this order
        total = total + torch.exp(-dist / (2.0 * a))
    return total


def redundancy(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(redundancy (T, N): similarity to the video's and the frame's mean token, lower is kept;
    similarity to the video's mean (T, N), which sets the frames' budgets), float32."""
    groups, tokens, dim = features.shape
    x = features.float().reshape(groups * tokens, dim)
    variance = x.var(dim=0, unbiased=False)
    channels = torch.sort(variance, stable=True).indices[: max(1, int(dim * CHANNEL_SHARE))]
    unit = F.normalize(x[:, channels].reshape(groups, tokens, -1), dim=-1)
    video = gaussian_similarity(unit, unit.mean(dim=(0, 1), keepdim=True))
    frame = gaussian_similarity(unit, unit.mean(dim=1, keepdim=True))
    return video + frame, video


def frame_budgets(video: torch.Tensor, ratio: float) -> torch.Tensor:
    """(T,) long: round(N (1 - q) (1 + p_t - mean p)) clamped to [1, N], p the softmax over frames
    of -mean similarity to the video's mean token at temperature 0.01 (a distinct frame gets more)."""
    tokens = video.shape[1]
    distinct = -video.mean(dim=-1)
    p = torch.softmax((distinct - distinct.max()) / TEMPERATURE, dim=0)
    scale = ((1.0 - pruning_rate(ratio)) * (1.0 + p - p.mean())).clamp(max=1.0)
    return (scale * tokens).round().long().clamp(min=1, max=tokens)


@register("vidcom2", VidCom2Config, "VidCom2 (vLLM's vidcom2 pruning): per-frame budgets by distinctiveness, "
                                    "least redundant tokens kept")
def vidcom2(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int], config: VidCom2Config,
            signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, _, report, done = begin("vidcom2", features, saliency, grid, config)
    if done is not None:
        return done
    score, video = redundancy(features)
    budget = frame_budgets(video, config.ratio)
    in_frame = torch.sort(score, dim=-1, stable=True).indices  # least redundant first, ties to the lowest index
    chosen = rank_mask(in_frame, budget).reshape(-1)
    # the final adjustment: the first `count` tokens of (chosen ones, then the others), each part by
    # increasing redundancy, ties to the lower flat index
    flat = score.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    part = (~chosen).long()
    if config.exact:
        count = report.M
        best = in_frame[:, 0] + torch.arange(groups, device=flat.device) * tokens  # each frame's least redundant
        part = part + 1
        part[best] = 0  # before any other: every frame keeps one while count >= T
    else:
        count = vllm_count(config.ratio, groups, tokens)
    order = order[torch.sort(part[order], stable=True).indices]
    kept = torch.zeros_like(chosen)
    kept[order[:count]] = True
    report.details = {"q": pruning_rate(config.ratio), "budget": budget.tolist(),
                      "per_frame": kept.reshape(groups, tokens).sum(-1).tolist()}
    return assemble(features.reshape(groups * tokens, -1), owner_of_kept(kept), report)
