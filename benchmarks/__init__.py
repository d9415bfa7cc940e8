"""The benchmark scripts, one module each, run from the checkout as `python -m benchmarks.NAME` (see each
module's docstring). They import each other as `benchmarks.NAME`, and the tests import them the same way.

A script that starts itself (or a neighbour) in a child process uses `command` and `environ`: the child
runs as `-m benchmarks.NAME` with the checkout first on PYTHONPATH, so it finds this package from any
working folder and in another Python environment (vLLM's CPU build) as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command(name: str, *args: str, python: str | os.PathLike[str] | None = None) -> list[str]:
    """The command line that runs `benchmarks.<name>` with `args`, under `python` (default: this one)."""
    return [str(python or sys.executable), "-m", f"benchmarks.{name}", *args]


def environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the checkout first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
