"""OTT-Vid settings: the paper's defaults and their validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Union

from ..method_catalog import PRESETS

MASSES = ("loo", "uniform")
BUDGETS = ("adaptive", "uniform")
ALPHAS = ("position", "kernel", "global")
SPATIALS = ("coverage", "saliency", "divprune", "adts", "scope")
# Switches between the paper's text (first value, the default) and the authors' published code
# (second value); see "The authors' code" in docs/method.md.
SEMANTIC_COSTS = ("cosine", "clamped")
K_ROUNDINGS = ("round", "floor")
BUDGET_CAPS = ("K", "K-1")
BUDGET_ROUNDINGS = ("final", "per_round")
LOCATION_NORMS = ("diagonal", "per_axis")
SINKHORN_STOPS = ("tol", "fixed")
MERGE_RULES = ("strict", "inclusive")

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

    The paper's text against the authors' published code, one switch per difference (defaults:
    the paper; `OTTVidConfig.official()` flips all seven):
    semantic_cost "cosine" (c_sem = 1 - cos) | "clamped" (1 - max(0, cos));
    k_rounding "round" (K = round(N r_s)) | "floor" (K = max(1, floor(N r_s)));
    budget_cap "K" | "K-1" (operations a pair may hold);
    budget_rounding "final" (real-valued redistribution, integers once at the end) |
    "per_round" (integer shares every redistribution round);
    location_norm "diagonal" (grid distance / grid diagonal) | "per_axis" (positions scaled to
    [0, 1] per axis, distance / sqrt(2));
    sinkhorn_stop "tol" (stop once the marginal error is below tol) | "fixed" (exactly max_iter
    iterations); merge_rule "strict" (merge if C < tau_c) | "inclusive" (merge if C <= tau_c).
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
    semantic_cost: str = "cosine"
    k_rounding: str = "round"
    budget_cap: str = "K"
    budget_rounding: str = "final"
    location_norm: str = "diagonal"
    sinkhorn_stop: str = "tol"
    merge_rule: str = "strict"

    @classmethod
    def official(cls, **overrides) -> "OTTVidConfig":
        """The authors' published code (github.com/minseokii/OTT-Vid, Qwen2.5-VL path) with the paper's
        hyper-parameters; keyword overrides win, e.g. `official(k_rounding="round")` for LLaVA."""
        settings = dict(
            ratio=0.1, gamma=0.3, tau_m=0.3, tau_b=0.3, tau_c=0.3, eps=0.01, max_iter=200,
            semantic_cost="clamped", k_rounding="floor", budget_cap="K-1", budget_rounding="per_round",
            location_norm="per_axis", sinkhorn_stop="fixed", merge_rule="inclusive",
        )
        settings.update(overrides)
        return cls(**settings)

    @classmethod
    def preset(cls, name: str, **overrides) -> "OTTVidConfig":
        """"paper" (the defaults) or "official" (`official()`), with keyword overrides."""
        require_choice("preset", name, PRESETS)
        return cls.official(**overrides) if name == "official" else cls(**overrides)

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
        require_choice("mass", self.mass, MASSES)
        require_choice("budget", self.budget, BUDGETS)
        require_choice("spatial", self.spatial, SPATIALS)
        require_choice("semantic_cost", self.semantic_cost, SEMANTIC_COSTS)
        require_choice("k_rounding", self.k_rounding, K_ROUNDINGS)
        require_choice("budget_cap", self.budget_cap, BUDGET_CAPS)
        require_choice("budget_rounding", self.budget_rounding, BUDGET_ROUNDINGS)
        require_choice("location_norm", self.location_norm, LOCATION_NORMS)
        require_choice("sinkhorn_stop", self.sinkhorn_stop, SINKHORN_STOPS)
        require_choice("merge_rule", self.merge_rule, MERGE_RULES)
        if isinstance(self.alpha, str):
            require_choice("alpha", self.alpha, ALPHAS)
        elif isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
            0.5 <= float(self.alpha) <= 1.0
        ):
            raise ValueError(f"alpha must be one of {', '.join(ALPHAS)} or a number in [0.5, 1], got {self.alpha!r}")

    def to_dict(self) -> dict:
        """Plain-data view, for reports and JSON."""
        return asdict(self)


def require_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """ValueError naming `name` and the allowed values unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
