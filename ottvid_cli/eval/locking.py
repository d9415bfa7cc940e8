"""The run folder's locks: an exclusive `flock` on a lock file beside each record file (one writer at a
time; a second is refused with `RunInUse`) and on OUT/.run.lock (config updates and merges, one at a
time). Re-entrant within a process; lock files are never deleted.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .benchmarks import EvalError
from .errors import RunInUse, one_line

RUN_LOCK = ".run.lock"

try:
    import fcntl
except ImportError:  # not POSIX: no locking (one writer per run folder is then the user's business)
    fcntl = None

_NO_LOCKS = {getattr(errno, name) for name in ("ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS") if hasattr(errno, name)}
_HELD: dict[str, list] = {}  # lock file -> [fd, count]: locks this process holds (re-entrant)


def lock_file(path: Path) -> Path:
    """The lock file guarding record file `path` (a separate file: `path` itself is replaced by merges)."""
    return path.with_name(f".{path.name}.lock")


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text(encoding="utf-8").strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid.isdigit() else ""


def acquire(lock: Path, *, wait: bool = False, what: str | None = None) -> str:
    """Take the exclusive lock `lock` (re-entrant within this process); RunInUse when another process
    holds it and not `wait`. Returns the key to pass to `release`."""
    key = str(lock.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    if lock.parent.exists() and not lock.parent.is_dir():
        raise EvalError(f"{lock.parent}: not a folder (the run folder must be one)")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EvalError(f"{lock.parent}: cannot write to the run folder: {one_line(exc)}") from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in _NO_LOCKS:  # a file system without locks (some NFS mounts): run unguarded, as without fcntl
                _HELD[key] = [fd, 1]
                return key
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise EvalError(f"{lock}: cannot lock: {one_line(exc)}") from None
            raise RunInUse(f"{what or lock} is being written by another run{_holder(lock)}: wait for it to "
                           "finish, or use another --out") from None
        try:  # who holds it, for the message another process shows
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
    _HELD[key] = [fd, 1]
    return key


def release(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[key]
        os.close(held[0])  # closing the descriptor drops the flock
