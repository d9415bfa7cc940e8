"""The errors of a run folder: `StoreError` (a record could not be written), `RunInUse` (another
process writes the folder) and `one_line`, an error as the one line a record or a message holds.
"""

from __future__ import annotations

from .benchmarks import EvalError


class StoreError(Exception):
    """A record could not be written (disk full, permissions): the run stops, what was written is kept.
    Not a ValueError, so it is never mistaken for a sample's own failure or for bad input."""


class RunInUse(EvalError):
    """Another process holds the lock of a record file of the run folder."""


def one_line(error: BaseException | str) -> str:
    """`error` as one line of at most 500 characters (its type's name when it says nothing)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:500]
