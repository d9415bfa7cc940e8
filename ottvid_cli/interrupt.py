"""Stopping a run from outside, between the iterations of its long loops.

    with stop_when(event):      # a threading.Event, or a callable returning True
        engine.ask(...)         # each loop's `checkpoint()` raises Interrupted once `event` is set

The scope belongs to the calling thread (a context variable): `session.Engine` opens one around a
request when it is given `cancel`, so the loops a request can size (Sinkhorn iterations, packets
and frames decoded) stop soon after the server cancels the request (its time is up, or its client
left). Outside a scope `checkpoint()` does nothing. A check reads a flag on the host: it never waits
for a GPU, and the loops on a GPU check once per launch group.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

Cancel = Any  # a callable returning True to stop, or anything with is_set() (threading.Event)

_scope: ContextVar[Cancel | None] = ContextVar("ottvid_stop_when", default=None)


class Interrupted(Exception):
    """The run was stopped from outside: its `cancel` was set when a loop checked it."""


def cancelled(cancel: Cancel | None) -> bool:
    """Whether `cancel` (None, a threading.Event or a callable) says stop."""
    if cancel is None:
        return False
    is_set = getattr(cancel, "is_set", None)
    return bool(is_set() if is_set is not None else cancel())


@contextmanager
def stop_when(cancel: Cancel | None) -> Iterator[None]:
    """Within the block, `checkpoint()` raises Interrupted once `cancel` says stop (None: the
    enclosing scope, if any, stays in force)."""
    if cancel is None:
        yield
        return
    token = _scope.set(cancel)
    try:
        yield
    finally:
        _scope.reset(token)


def current() -> Cancel | None:
    """The calling thread's scope's `cancel` (None outside a scope): a thread started for the caller can
    honour it too."""
    return _scope.get()


def checkpoint(what: str = "the run") -> None:
    """Raise Interrupted if the current scope's `cancel` says stop; `what` names the loop stopped."""
    cancel = _scope.get()
    if cancel is not None and cancelled(cancel):
        raise Interrupted(f"{what} was stopped: the request was cancelled")
