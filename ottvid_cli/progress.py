"""How far a long step has come, for whoever shows it (the command line's progress line, a server).

    with reporting(callback):          # callback(stage, done, total), e.g. ("encode", 512, 7200)
        engine.ground(...)             # the chunked preparation calls `advance` after each chunk

Like `interrupt.stop_when`, the scope belongs to the calling thread (a context variable), so the library
reports without printing and without a callback threaded through every call. Outside a scope `advance`
does nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

Callback = Callable[[str, int, int], None]

_scope: ContextVar[Callback | None] = ContextVar("ottvid_progress", default=None)


@contextmanager
def reporting(callback: Callback | None) -> Iterator[None]:
    """Within the block, `advance(stage, done, total)` calls `callback` (None: the enclosing scope's)."""
    if callback is None:
        yield
        return
    token = _scope.set(callback)
    try:
        yield
    finally:
        _scope.reset(token)


def advance(stage: str, done: int, total: int) -> None:
    """`done` of `total` units of `stage` are finished (frames through the encoder, for "encode")."""
    callback = _scope.get()
    if callback is not None:
        callback(stage, done, total)
