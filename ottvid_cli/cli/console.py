"""The rich console the command line writes through where a closed pipe must not count as a failure."""

from __future__ import annotations

import errno

from rich.console import Console


class PipeConsole(Console):
    """A rich console whose closed pipe raises BrokenPipeError (the command then exits 0, see
    `_OneLineErrors.invoke`) where rich's own would exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")
