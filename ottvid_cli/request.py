"""What one question asks of the library, as values: `Compression` (method, ratio, preset, options) and
`Request` (frames, compression, reply length, multiple-choice options, ground's point). Every front end
builds one `Request` and hands it to `session.Engine.ask` / `ground`.

    from ottvid_cli.request import Compression, Request
    request = Request(Sampling(frames=16), Compression("fastvid", 0.25, options={"d": 0.3}), max_new_tokens=32)
    engine.ask("video.mp4", "What happens?", request)

`Compression.config(backbone)` is the one place a method's full config is built (the preset, the
backbone's `official_overrides` / `method_defaults`, the options over them); `Compression.check()` builds
it without a model, to refuse bad settings in one line before one loads. The module imports no torch
(the method registry loads inside those calls), so the command line and the vLLM plugin's settings use
it before the slow imports.

A config is never given another ratio behind its caller's back: a hand-built config goes in as
`Compression.of(config, method)` (its own ratio is the compression's), and one whose ratio differs
from the ratio named with it is refused.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Mapping

from .method_catalog import PRESETS

if TYPE_CHECKING:
    from .sampling import Sampling

__all__ = ["DEFAULT_TOKENS", "Compression", "MethodArgError", "Request", "option_types", "options_line"]


class MethodArgError(ValueError):
    """A bad method option (`--method-arg`, a `Compression`'s options); the message is one line and names
    the method's options."""


def option_types(method: str) -> dict[str, tuple[type, ...]]:
    """Each config field of `method` and the types its value may take (NoneType included if optional)."""
    from .compression import methods

    config = methods.get(method).config
    try:
        hints = typing.get_type_hints(config)
    except Exception:  # an annotation that does not resolve: the default's type
        hints = {}
    out = {}
    for f in fields(config):
        hint = hints.get(f.name)
        if typing.get_origin(hint) in (typing.Union, getattr(types, "UnionType", typing.Union)):
            out[f.name] = tuple(typing.get_args(hint))
        elif isinstance(hint, type):
            out[f.name] = (hint,)
        else:
            out[f.name] = (type(getattr(config(), f.name)),)
    return out


def options_line(method: str, known: Any) -> str:
    """'fastvid options: d, tau, ...' (or that the method takes none), for one-line errors."""
    known = list(known)
    if not known:
        return f"{method} takes no options" if method != "none" else "--method none compresses nothing: it has no options"
    return f"{method} options: {', '.join(known)}"


@dataclass(frozen=True)
class Compression:
    """How a video's tokens are cut down: `method` (a registered name, or "none"), `ratio` (the share of
    visual tokens kept), `preset` (OTT-Vid's: "paper" or "official"; other methods run at their own
    defaults), `options` (config fields, which win over the preset and the backbone's defaults),
    `max_visual_tokens` (the ratio is lowered so that at most this many reach the LLM). `ready`: a
    config built by hand (`Compression.of`), used as it is (with `options` set over it)."""

    method: str = "ottvid"
    ratio: float = 0.1
    preset: str = "paper"
    options: Mapping[str, Any] = field(default_factory=dict)
    max_visual_tokens: int | None = None
    ready: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", dict(self.options or {}))
        ready_ratio = getattr(self.ready, "ratio", None)
        if self.ready is not None and ready_ratio != self.ratio:
            raise ValueError(f"the config's ratio {ready_ratio!r} is not the ratio asked for ({self.ratio:g}): "
                             f"build the config at that ratio, or give it alone (Compression.of)")

    @classmethod
    def of(cls, config: Any, method: str = "ottvid", max_visual_tokens: int | None = None) -> "Compression":
        """A hand-built `config` of `method`, run as it is, at its own ratio."""
        return cls(method=method, ratio=config.ratio, max_visual_tokens=max_visual_tokens, ready=config)

    def config(self, backbone: Any = None) -> Any:
        """The full config (None for method "none"): the `ready` one when given; else for ottvid the
        preset ("paper", or "official": the authors' code, with the backbone's `official_overrides`),
        for another method its defaults with the backbone's `method_defaults[method]` over them (e.g.
        FastVID's LLaVA-OneVision path on LLaVA-OneVision); `options` over either. ValueError (or
        TypeError) for a bad preset or option, from the config's own checks."""
        from .compression import OTTVidConfig, methods

        method, ratio, preset, options = self.method, self.ratio, self.preset, dict(self.options)
        if method == "none":
            methods.make_config("none", 1.0, **options)  # no options: a ValueError naming none's
            return None
        if self.ready is not None:
            return replace(self.ready, **options) if options else self.ready
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        if method != "ottvid":
            if preset != "paper":
                raise ValueError(f"preset {preset!r} is OTT-Vid's (the authors' code): method {method} has its own "
                                 f"defaults, set with options")
            defaults = dict((getattr(backbone, "method_defaults", None) or {}).get(method, {}))
            return methods.make_config(method, ratio, **{**defaults, **options})
        overrides = dict(getattr(backbone, "official_overrides", {}) or {}) if preset == "official" else {}
        methods.make_config("ottvid", ratio, **options)  # unknown options: the registry's one-line error
        return OTTVidConfig.preset(preset, ratio=ratio, **{**overrides, **options})

    def check(self) -> Any:
        """The config without a model (`config()`: the backbone's defaults aside), so that bad settings
        are refused before one loads; MethodArgError, one line naming the method's options."""
        try:
            return self.config()
        except (ValueError, TypeError) as exc:
            known = [k for k in option_types(self.method) if k != "ratio"]
            raise MethodArgError(f"--method {self.method}: {exc} ({options_line(self.method, known)})") from None


@dataclass(frozen=True)
class Request:
    """One question's settings for `Engine.ask` / `Engine.ground`: `sampling` (None: the task's default,
    the model's frame count for ask, 2 fps for ground), `compression`, `max_new_tokens` (None: the
    task's default, 64 for ask, 48 for ground), `choices` (ask: multiple-choice options; the result's
    `letter` is the one chosen) and `point` (ground: the query names a moment, read as [t, t])."""

    sampling: Sampling | None = None
    compression: Compression = field(default_factory=Compression)
    max_new_tokens: int | None = None
    choices: tuple[str, ...] | None = None
    point: bool = False

    def __post_init__(self) -> None:
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))

    def tokens(self, task: str) -> int:
        """The longest reply in tokens: `max_new_tokens`, else the task's default."""
        return self.max_new_tokens if self.max_new_tokens is not None else DEFAULT_TOKENS[task]


DEFAULT_TOKENS = {"ask": 64, "ground": 48}  # a reply's length at most, in tokens, by task
