"""The method registry: every token-compression method as a pure function with compress()'s contract.

    fn(features (T, N, D), saliency (T, N), grid (H, W), config, signals=None) -> Compressed

`Compressed.features` (M, D) in the input dtype; `index` (M,) ascending unique flat indices t*N + n
of each output token's position (its root's); `assignment` (T*N,) output row representing each
input token, -1 if dropped; `report` any object with `to_dict()`; `mixing` the sparse (M, T*N)
merge map with features == mixing @ flat input, or None when each output is the uniform average of
its assignment members (`Compressed.apply` follows either). Each method has a frozen config
dataclass whose first field is `ratio` and whose defaults are the official ones.

`signals`: optional encoder outputs a method's official code reads besides the features, by name
(docs/methods.md, "Per-backbone paths and signals"): "attention" (T, N) per-token attention and
"frame_features" (T, D') per-frame global features, with an optional "source" string naming where
they came from (e.g. "siglip_head"). A method uses the ones it knows and ignores the rest; without
them it falls back to `saliency` and the features (the default).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

import torch

from ..types import Compressed

MethodFn = Callable[..., Compressed]  # (features, saliency, grid, config, signals=None) -> Compressed


CountFn = Callable[[Any, int, int], "int | None"]  # (config, groups, tokens) -> tokens returned, or None


@dataclass(frozen=True)
class Method:
    """A registered method: its name, config class, function, a one-line summary and its count rule
    (`output_count`)."""

    name: str
    config: type
    fn: MethodFn
    summary: str
    count: CountFn | None = None

    def defaults(self) -> dict[str, Any]:
        """The config's fields and default values (ratio included)."""
        return {f.name: getattr(self.config(), f.name) for f in fields(self.config)}


@dataclass
class MethodReport:
    """What a method did, as plain data: counts, its config, method-specific details, stage times."""

    method: str
    T: int
    N: int
    M: int  # target output tokens
    kept: int  # output tokens actually returned
    config: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_REGISTRY: dict[str, Method] = {}


def register(name: str, config: type, summary: str, count: CountFn | None = None) -> Callable[[MethodFn], MethodFn]:
    """Decorator: register `fn` under `name` with its config class; `count` its count rule when it is
    not `exact_count`'s (see `output_count`)."""

    def wrap(fn: MethodFn) -> MethodFn:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} is already registered")
        _REGISTRY[name] = Method(name=name, config=config, fn=fn, summary=summary, count=count)
        return fn

    return wrap


def exact_count(config: Any, groups: int, tokens: int) -> int | None:
    """The default count rule: `target_count` when the config asks for the exact retention (`exact`
    true, or no such option), else None (the method then keeps a count of its own that depends on the
    content)."""
    if not getattr(config, "exact", True):
        return None
    return target_count(config.ratio, groups, tokens)


def output_count(name: str, config: Any, groups: int, tokens: int) -> int | None:
    """How many tokens method `name` with `config` returns for `groups` x `tokens` input tokens, as a pure
    function of them (what a server must know before the encoder runs: vLLM sizes the prompt's
    placeholders from it), or None when the count depends on the content. tests/test_methods_count.py
    checks it against every method's output, over its options."""
    method = get(name)
    return (method.count or exact_count)(config, groups, tokens)


def names() -> list[str]:
    """Registered method names, in registration order."""
    return list(_REGISTRY)


def get(name: str) -> Method:
    """The registered method `name`; ValueError listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}: use one of {', '.join(_REGISTRY)}") from None


def make_config(name: str, ratio: float = 0.1, **options: Any) -> Any:
    """The config of method `name` with `ratio` and options set (the config validates them)."""
    method = get(name)
    known = {f.name for f in fields(method.config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"method {name!r} has no option {', '.join(unknown)}; options: {', '.join(sorted(known))}")
    return method.config(ratio=ratio, **options)


def compress_with(name: str, features: torch.Tensor, saliency: torch.Tensor | None, grid: tuple[int, int],
                  ratio: float = 0.1, signals: dict[str, Any] | None = None, **options: Any) -> Compressed:
    """Compress with method `name` at `ratio`; `options` set fields of its config; `signals` go to the
    method (those it does not use are ignored)."""
    return get(name).fn(features, saliency, grid, make_config(name, ratio, **options), signals=signals)


def target_count(ratio: float, groups: int, tokens: int) -> int:
    """The exact retention every method returns by default: max(1, round(ratio * T * N))."""
    return max(1, round(ratio * groups * tokens))
