"""Where the built environments are kept (`cache_root`) and the lock that keeps two sessions from
building the same one at once (`locked`); shared by `benchmarks.envs.vllm_env` and the tests' lmms-eval
overlay (tests/support/overlay_env.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where the environments are kept: $OTTVID_TEST_ENV_DIR, else $XDG_CACHE_HOME/ottvid/test-envs."""
    if os.environ.get("OTTVID_TEST_ENV_DIR"):
        return Path(os.environ["OTTVID_TEST_ENV_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ottvid" / "test-envs"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (POSIX; elsewhere no lock) so two sessions do not build at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
