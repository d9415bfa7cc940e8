"""OUT/config.json, the run's settings: written by the first run, checked by each resume (only
methods and ratios may grow, a few settings may change; any other difference is refused in one
line), read back by `load_config`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .atomic import write_atomic
from .benchmarks import EvalError
from .errors import one_line
from .locking import RUN_LOCK, acquire, release

CONFIG = "config.json"
GROWABLE = ("methods", "ratios")  # config keys a resume may extend
UPDATABLE = ("limit", "skip_missing", "samples")  # config keys a resume may change (the last value is kept)
PER_KIND = ("sampling",)  # {kind: ...}: a resume may add kinds (a new --limit reaches other samples), not change one


def save_config(out_dir: Path | str, config: dict) -> dict:
    """Write OUT/config.json, or check a resume against it. Only `methods` and `ratios` may change
    (the stored lists grow to the union), `limit` / `skip_missing` / `samples` (the new value is
    stored) and `sampling` may gain kinds of sample (a new --limit reaching grounding samples); any
    other difference is refused with a one-line EvalError. One process at a time (OUT/.run.lock), so
    shards adding methods at the same moment do not lose each other's."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"{out}: cannot make the run folder: {one_line(exc)}") from None
    folder = acquire(out / RUN_LOCK, wait=True)  # shards starting together: one read-modify-write at a time
    try:
        return _save_config(out / CONFIG, config)
    finally:
        release(folder)


def _save_config(path: Path, config: dict) -> dict:
    config = json.loads(json.dumps(config))  # normalise tuples, paths
    if path.exists():
        old = _absolute_folders(_read_config(path), config)
        differences = config_differences(old, config)
        if differences:
            raise EvalError(f"{path}: this folder holds a run with other settings ({'; '.join(differences)}): use "
                            "another output folder or the same settings (only methods and ratios may be added)")
        for key in PER_KIND:
            mine, theirs = config.get(key), old.get(key)
            if isinstance(mine, dict) and isinstance(theirs, dict):
                config[key] = {**theirs, **mine}
        for key in GROWABLE:
            merged = list(old.get(key) or [])
            merged += [v for v in config.get(key) or [] if v not in merged]
            config[key] = merged
    try:
        write_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise EvalError(f"{path}: cannot write: {one_line(exc)}") from None
    return config


_SAME_AS = {"pixels": "max_pixels"}  # a per-kind sampling entry that follows a setting of the run


def _shown(value: Any) -> str:
    """A config value as a person reads it: unset, yes / no, a list without brackets, a plain string."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(v) for v in value) or "none"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def config_differences(old: dict, config: dict) -> list[str]:
    """What a resume with `config` would change in the run `old` records and may not: one
    'setting X there, Y now' per setting (the kinds' sampling entries that follow from a setting
    already named are left out; kinds only one of them has are no difference)."""
    found, named = [], set()
    for key in sorted(set(old) | set(config)):
        if key not in GROWABLE + UPDATABLE + PER_KIND and old.get(key) != config.get(key):
            found.append(f"{key} {_shown(old.get(key))} there, {_shown(config.get(key))} now")
            named.add(key)
    for key in PER_KIND:
        mine, theirs = config.get(key), old.get(key)
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            continue
        for kind in sorted(set(mine) & set(theirs)):
            before, now = theirs[kind], mine[kind]
            if not (isinstance(before, dict) and isinstance(now, dict)):
                if before != now:
                    found.append(f"{key} of {kind} samples {_shown(before)} there, {_shown(now)} now")
                continue
            for entry in sorted(set(before) | set(now)):
                if before.get(entry) != now.get(entry) and _SAME_AS.get(entry, entry) not in named:
                    found.append(f"{key} {entry} of {kind} samples {_shown(before.get(entry))} there, "
                                 f"{_shown(now.get(entry))} now")
    return found


def _absolute_folders(old: dict, config: dict) -> dict:
    """`old` with a model or SigLIP folder recorded by its relative name (runs written before folders
    were recorded resolved) taken as the absolute path `config` records, when it names that folder
    from here: resuming such a run from where it was started is not "another model"."""
    old = dict(old)
    for key in ("model", "siglip_head"):
        before, now = old.get(key), config.get(key)
        if (isinstance(before, str) and isinstance(now, str) and before != now and os.path.isabs(now)
                and not os.path.isabs(before) and os.path.isdir(before) and Path(before).resolve() == Path(now)):
            old[key] = now
    return old


def _read_config(path: Path) -> dict:
    """OUT/config.json as a dict; an unreadable file, bad JSON or JSON that is not an object is a
    one-line EvalError."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalError(f"{path}: unreadable run config: {one_line(exc)}") from None
    if not isinstance(config, dict):
        what = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(config), "a number")
        raise EvalError(f"{path}: unreadable run config: a JSON object was expected, not {what}")
    return config


def load_config(out_dir: Path | str) -> dict:
    path = Path(out_dir) / CONFIG
    if not path.exists():
        raise EvalError(f"{path}: no run config here")
    return _read_config(path)
