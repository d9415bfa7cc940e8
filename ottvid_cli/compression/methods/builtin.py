"""The methods that need no module of their own: `ottvid` (the paper's) and `none` (keep everything)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import OTTVidConfig
from ..ottvid import output_count
from ..stream import compress
from ..types import Compressed
from .registry import MethodReport, register


@register("ottvid", OTTVidConfig, "OTT-Vid: coverage selection + optimal-transport temporal merging (the paper)",
          count=output_count)
def ottvid(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int], config: OTTVidConfig,
           signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    return compress(features, saliency, grid, config)


@dataclass(frozen=True)
class NoneConfig:
    """No compression: every token kept. `ratio` must be 1 (it is what is kept)."""

    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.ratio != 1.0:
            raise ValueError(f"method none keeps every token: ratio must be 1, got {self.ratio!r}")


@register("none", NoneConfig, "no compression: every visual token reaches the LLM",
          count=lambda config, groups, tokens: groups * tokens)
def none(features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int], config: NoneConfig,
         signals: dict[str, torch.Tensor] | None = None) -> Compressed:
    groups, tokens = features.shape[:2]
    every = torch.arange(groups * tokens, device=features.device)
    report = MethodReport(method="none", T=groups, N=tokens, M=groups * tokens, kept=groups * tokens,
                          config={"ratio": 1.0})
    return Compressed(features=features.reshape(groups * tokens, -1).clone(), index=every, assignment=every.clone(),
                      report=report)
