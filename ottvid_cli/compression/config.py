"""OTT-Vid settings: the paper's defaults and their validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Union

MASSES = ("loo", "uniform")
BUDGETS = ("adaptive", "uniform")
ALPHAS = ("position", "kernel", "global")
SPATIALS = ("coverage", "saliency", "divprune", "adts", "scope")

AlphaSetting = Union[str, float]


@dataclass(frozen=True)
class OTTVidConfig:
    """Hyper-parameters of OTT-Vid (paper Sec. 3 and App. A defaults).

    ratio: total retention r in (0, 1]; gamma: temporal share (r_s = r**(1-gamma), r_t = r**gamma);
    tau_m / tau_b / tau_c: mass temperature, budget temperature, merge-or-prune cost threshold;
    eps / max_iter / tol: Sinkhorn regularisation, iteration cap and marginal tolerance.
    Ablation switches: mass ("loo" | "uniform"), budget ("adaptive" | "uniform"),
    alpha ("position" | "kernel" | "global" | a fixed float in [0.5, 1]) and
    spatial ("coverage" | "saliency" | "divprune" | "adts" | "scope", App. B.1).
    """

    ratio: float = 0.1
    gamma: float = 0.3
    tau_m: float = 0.3
    tau_b: float = 0.3
    tau_c: float = 0.3
    eps: float = 0.01
    max_iter: int = 200
    tol: float = 1e-5
    mass: str = "loo"
    budget: str = "adaptive"
    alpha: AlphaSetting = "position"
    spatial: str = "coverage"

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            return float(value)

        if not 0.0 < number("ratio") <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio!r}")
        if not 0.0 <= number("gamma") <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")
        for name in ("tau_m", "tau_b", "eps", "tol"):
            if number(name) <= 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if number("tau_c") < 0.0:
            raise ValueError(f"tau_c must be >= 0, got {self.tau_c!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {self.max_iter!r}")
        _choice("mass", self.mass, MASSES)
        _choice("budget", self.budget, BUDGETS)
        _choice("spatial", self.spatial, SPATIALS)
        if isinstance(self.alpha, str):
            _choice("alpha", self.alpha, ALPHAS)
        elif isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
            0.5 <= float(self.alpha) <= 1.0
        ):
            raise ValueError(f"alpha must be one of {', '.join(ALPHAS)} or a number in [0.5, 1], got {self.alpha!r}")

    def to_dict(self) -> dict:
        """Plain-data view, for reports and JSON."""
        return asdict(self)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
