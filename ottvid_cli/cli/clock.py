"""When the run began (the clock the report's `startup` and `wall` and the progress lines count from),
and a result's timings made to add up to its wall (`account`).

A process's first command counts from the moment this package was imported (the interpreter's own
start, some tens of ms, is not seen); a later command in the same process (tests invoking the app
in-process) counts from its own start."""

from __future__ import annotations

import time
from typing import Any

_IMPORTED = time.perf_counter()
_started: float | None = None


def begin() -> float:
    """Mark the start of a command (the group's `main`): the import time for the process's first."""
    global _started
    _started = _IMPORTED if _started is None else time.perf_counter()
    return _started


def started() -> float:
    """The start of the command now running (the import time if none has begun)."""
    return _IMPORTED if _started is None else _started


def since_ms(moment: float) -> float:
    """Milliseconds from `moment` (a `time.perf_counter()` value) to now."""
    return (time.perf_counter() - moment) * 1e3


def account(data: dict, wall: float, backbone: Any, began: float | None, overlap: float | None) -> None:
    """Make a result's `timings_ms` add up to its `wall` (docs/cli.md, "Timings"): the first question
    gets `startup` (the command's start to the model's load: imports, checks), a later one no `startup`,
    `load` or `warmup` (they ran once, before the first); `other` is the time no stage covers.
    `decode_overlap_ms`: the part of the decoding that ran beside the load (None: no early decoding):
    wall = the stages' sum - decode_overlap_ms."""
    load_began = getattr(backbone, "load_began", None)
    startup = (load_began - began) * 1e3 if began is not None and load_began is not None else None
    timings = data["timings_ms"] = {"startup": startup, **data["timings_ms"]}  # in the order they ran
    if began is None:
        timings["load"] = None
        timings.pop("warmup", None)
    overlap = overlap if overlap is not None and not data.get("cache_hit") else None
    counted = sum(v for k, v in timings.items() if v is not None and k != "wall") - (overlap or 0.0)
    timings["other"] = max(0.0, wall - counted)
    timings["wall"] = wall
    data["decode_overlap_ms"] = overlap
    data["decoded_while_loading"] = overlap is not None
