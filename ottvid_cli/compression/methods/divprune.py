"""`divprune`: max-min diversity selection per frame (DivPrune, Alvar et al., CVPR 2025).

Steps (docs/methods.md): cosine distance 1 - cos between the tokens of each frame; the first pick
is the most isolated token (largest distance to its nearest other token), then each pick is the
token farthest from the picks so far (farthest-point sampling, spatial.py `greedy_max_min`); the
budget is split over the frames, the M mod T extra tokens going to the frames whose next pick is
the farthest. Nothing is merged; saliency is not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spatial import gram_cosine, greedy_max_min
from ..types import Compressed
from .common import assemble, begin, check_flags, check_ratio, owner_of_kept, split_evenly
from .registry import register


@dataclass(frozen=True)
class DivPruneConfig:
    """ratio: fraction of the T*N tokens kept, in (0, 1].
    exact: keep exactly max(1, round(ratio T N)) tokens; False keeps the official
    int(round(ratio * n)) picks of each selection (n its token count; at least 1).
    per_frame: one selection per frame (the video use, as in the paper's App. B.1); False runs one
    selection over all T*N tokens at once, as the official code does over an image's token sequence.
    bug_compatible: the official loop (needs exact=False): already picked tokens are not excluded,
    so a frame whose remaining tokens all duplicate picks re-picks a token (the official then feeds
    that token twice; here it is kept once, so fewer tokens come back), and the first pick's
    isolation is the second-smallest entry of its distance column, self-distance included."""

    ratio: float = 0.1
    exact: bool = True
    per_frame: bool = True
    bug_compatible: bool = False

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_flags(self.exact, self.bug_compatible)
        if not isinstance(self.per_frame, bool):
            raise ValueError(f"per_frame must be True or False, got {self.per_frame!r}")


def official_picks(dist: torch.Tensor, k: int) -> torch.Tensor:
    """The official DivPrune loop on distances (G, n, n): (G, k) picks, repeats possible.

    First pick: argmax of each column's second-smallest entry (self included); then argmax over all
    tokens (picked ones included) of the distance to the nearest pick.
    """
    groups, n, _ = dist.shape
    rows = torch.arange(groups, device=dist.device)
    order = torch.empty(groups, k, dtype=torch.long, device=dist.device)
    if n == 1:
        return order.zero_()
    order[:, 0] = dist.topk(2, dim=1, largest=False).values[:, 1].argmax(-1)
    nearest = dist[rows, order[:, 0]].clone()
    for step in range(1, k):
        order[:, step] = nearest.argmax(-1)
        torch.minimum(nearest, dist[rows, order[:, step]], out=nearest)
    return order


def pick_gain(sim: torch.Tensor, order: torch.Tensor, step: int) -> torch.Tensor:
    """Max-min score of each group's pick number `step` (G,): its distance to the nearest earlier
    pick, or for the first pick its distance to its nearest other token."""
    groups, n, _ = sim.shape
    rows = torch.arange(groups, device=sim.device)
    pick = order[:, step]
    dist = (1.0 - sim[rows, pick]).clamp_min(0.0)  # (G, n): distances from the pick
    if step == 0:
        dist[rows, pick] = float("inf")
        return dist.min(-1).values if n > 1 else torch.zeros(groups, device=sim.device)
    return dist.gather(1, order[:, :step]).min(-1).values


@register("divprune", DivPruneConfig, "DivPrune: max-min diversity (farthest-point) selection per frame")
def divprune(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int],
             config: DivPruneConfig, signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens, _, report, done = begin("divprune", features, saliency, grid, config)
    if done is not None:
        return done
    x = features.float() if config.per_frame else features.float().reshape(1, groups * tokens, -1)
    sets, n = x.shape[:2]
    if config.exact:
        k_max = min(-(-report.M // sets), n)
    else:
        k_max = min(max(1, int(round(config.ratio * n))), n)
    sim = gram_cosine(x)[0]
    if config.bug_compatible:
        order = official_picks(1.0 - sim, k_max)
    else:
        order = greedy_max_min(sim, torch.ones(sets, n, device=x.device), k_max, saliency_scaled=False)
    counts = torch.full((sets,), k_max, dtype=torch.long, device=x.device)
    if config.exact and report.M % sets:
        counts = split_evenly(report.M, pick_gain(sim, order, k_max - 1))
    taken = torch.arange(k_max, device=x.device) < counts.unsqueeze(-1)
    kept = torch.zeros(sets, n, dtype=torch.bool, device=x.device).scatter_(1, order, taken)  # repeats: all taken
    report.details = {"per_selection": counts.tolist()}
    return assemble(features.reshape(groups * tokens, -1), owner_of_kept(kept.reshape(-1)), report)
