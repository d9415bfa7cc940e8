"""`--method-arg key=value`: text into a method's config fields, typed by the field, with one-line errors.

    parse_method_args("fastvid", ["exact=false", "d=0.3"])        # {"exact": False, "d": 0.3}
    parse_method_args(["ottvid", "fastvid"], ["fastvid.d=0.3"])   # {"ottvid": {}, "fastvid": {"d": 0.3}}

A value becomes the field's type: bool (true/false, yes/no, on/off, 1/0), int, float, str; a field
that takes several (OTT-Vid's `alpha`: a name or a number) tries them in that order, str last.
`none`/`null` is None where the field allows it. The config's own checks (ranges, choices) run in
`request.Compression.check`. `method_options` is the one entry point (parse, type, check every method at
every ratio); `Compression.config` builds the config once the model is loaded. The registry imports
torch, so the command line calls `method_options` after its cheap checks and before loading the model.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .request import Compression, MethodArgError, option_types, options_line

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _value(method: str, key: str, text: str, allowed: tuple[type, ...]) -> Any:
    low = text.strip().lower()
    if type(None) in allowed and low in ("none", "null"):
        return None
    order = [t for t in (bool, int, float) if t in allowed] + [t for t in allowed if t is str]
    for kind in order:
        if kind is bool:
            if low in TRUE or low in FALSE:
                return low in TRUE
        elif kind is int:
            try:
                return int(low)
            except ValueError:
                pass
        elif kind is float:
            try:
                value = float(low)
            except ValueError:
                continue
            if math.isfinite(value):
                return value
        else:
            return text
    names = {bool: "true/false", int: "an integer", float: "a number"}
    wanted = " or ".join(names[t] for t in order) + (" or none" if type(None) in allowed else "")
    raise MethodArgError(f"--method-arg {key}={text}: {method} option {key} takes {wanted or 'no value'}, "
                         f"got {text!r}")


def _split(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise MethodArgError(f"--method-arg must look like key=value, got {item!r}")
    return key.strip(), value.strip()


def parse_method_args(method: str | Sequence[str], items: Sequence[str] | None) -> Any:
    """`items` ("key=value" or "method.key=value") as config options. One method: its options dict.
    Several: {method: options}; a plain key goes to every method that has that option, a
    `method.key` to that method alone. Raises MethodArgError (one line)."""
    chosen = [method] if isinstance(method, str) else list(dict.fromkeys(method))
    types_of = {m: option_types(m) for m in chosen}
    out: dict[str, dict[str, Any]] = {m: {} for m in chosen}
    for item in items or ():
        key, text = _split(item)
        if key.rpartition(".")[2] == "ratio":
            raise MethodArgError("--method-arg ratio: give the share kept with --ratio")
        target, dot, field = key.partition(".")
        if dot and target in types_of:
            targets, key = [target], field
        elif dot:
            raise MethodArgError(f"--method-arg {item}: {target} is not a method of this run "
                                 f"({', '.join(chosen)})")
        else:
            targets = [m for m in chosen if key in types_of[m]]
        if not targets or any(key not in types_of[m] for m in targets):
            options = "; ".join(options_line(m, [k for k in types_of[m] if k != "ratio"]) for m in chosen)
            raise MethodArgError(f"--method-arg {item}: unknown option {key!r} ({options})")
        for m in targets:
            out[m][key] = _value(m, key, text, types_of[m][key])
    return out[chosen[0]] if isinstance(method, str) else out


def method_options(methods: Sequence[str], ratios: Sequence[float], preset: str,
                   items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """The one place a run's method options are read: `items` ("key=value" or "method.key=value" text,
    as `--method-arg` gives them) parsed, typed and checked for each of `methods` at each of `ratios`
    with `preset` (OTT-Vid's only). Returns {method: its options}; MethodArgError (one line). Needs no
    model: call it before loading one, then `request.Compression(...).config(backbone)` once it is loaded."""
    if preset != "paper" and "ottvid" not in methods:
        raise MethodArgError(f"--preset {preset} is OTT-Vid's (the authors' code): it applies to --method ottvid only")
    options = parse_method_args(list(methods), items)
    for method in methods:
        for ratio in ratios:
            Compression(method, ratio, preset if method == "ottvid" else "paper", options[method]).check()
    return options
