"""Exit codes, the consoles (`out`, `err`), the one-line error style (`error: ...` on stderr) and the
group that turns every usage error and unexpected exception into one such line."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

try:  # typer >= 0.20 carries its own copy of click, without Abort (typer has its own)
    from typer._click import exceptions as click
    from typer.exceptions import Abort as _Abort
except ImportError:
    from click import exceptions as click

    _Abort = click.Abort

from ..compat import LibraryMismatch, check_libraries
from . import clock
from .console import PipeConsole
from .help import HelpGroup

EXIT_RUN, EXIT_USAGE, EXIT_NO_SPAN, EXIT_WRITE = 1, 2, 3, 4


_NO_ARGS = getattr(click, "NoArgsIsHelpError", ())


class OneLineErrors(HelpGroup):
    """Usage errors (unknown option, bad number, missing argument) as one `error:` line, exit 2."""

    def invoke(self, ctx):
        """A reader that went away (`ottvid ask ... | head -1`) is no failure: exit 0, quietly."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _reader_gone()
            raise typer.Exit(0) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        clock.begin()
        _closed_streams_to_devnull()
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as exc:  # `ottvid` or `ottvid cache` alone: the help on stdout, exit 0, as --help
            text = exc.format_message()  # our groups print their help themselves; click's come as text
            if text.strip():
                typer.echo(text)
            code = 0
        except click.UsageError as exc:
            if not standalone_mode:
                raise
            command = exc.ctx.command_path if exc.ctx is not None else "ottvid"
            error(f"{_usage_message(exc)} (see `{command} --help`)")
            code = EXIT_USAGE
        except click.ClickException as exc:
            if not standalone_mode:
                raise
            error(exc.format_message())
            code = exc.exit_code
        except _Abort:
            if not standalone_mode:
                raise
            error("aborted")
            code = 130
        except LibraryMismatch as exc:  # torch, torchvision, transformers that do not go together (compat.py)
            if not standalone_mode:
                raise
            error(_escaped(str(exc)))
            code = EXIT_RUN
        except Exception as exc:  # not the user's input: our bug, or a library that changed under us
            if not standalone_mode:
                raise
            error(_libraries_at_fault() or _internal(exc))
            code = EXIT_RUN
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def _closed_streams_to_devnull() -> None:
    """Started with stdout or stderr closed (`ottvid serve >&- 2>&-`): Python then has None there and
    every print would be an internal error; what would go there is dropped instead, as into a pipe
    nobody reads. (chat refuses a closed stdin itself: it has nothing to read.)"""
    import os

    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))


def _reader_gone() -> None:
    """stdout's reader closed the pipe: what is still to be written there (and Python's flush at exit)
    goes to /dev/null instead of failing again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture)
        pass
    finally:
        os.close(devnull)


def _libraries_at_fault() -> str:
    """After an unexpected error: the libraries' own fault when they do not go together (their versions;
    where the run had imported torch, also torchvision imported beside it), as one line; "" when they
    do, or when the check itself fails (then the error is reported as it came)."""
    try:
        check_libraries(imports="torch" in sys.modules)
    except LibraryMismatch as exc:
        return _escaped(str(exc))
    except Exception:  # noqa: BLE001 - the check of a broken installation failing too: the first error is said
        return ""
    return ""


def _escaped(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _internal(exc: BaseException) -> str:
    """One line for an exception nothing expected: its type and first line, said to be ours."""
    from rich.markup import escape

    text = " ".join((str(exc).strip().splitlines() or [""])[0].split())[:300]
    return escape(f"internal error: {type(exc).__name__}: {text} (a bug in ottvid or an incompatible library "
                  f"version, not a problem with your input; please report it)")


def _usage_message(exc: click.UsageError) -> str:
    if isinstance(exc, click.BadParameter) and exc.param is not None and not isinstance(exc, click.MissingParameter):
        names = [n for n in getattr(exc.param, "opts", []) if n.startswith("--")] or [exc.param.name.upper()]
        return f"{names[0]}: {exc.message.rstrip('.')}"
    return exc.format_message().rstrip(".")


out = PipeConsole()
err = PipeConsole(stderr=True)


def tables() -> Console:
    """stdout for a report with tables: the terminal, or a console as wide as the tables for a pipe."""
    from .layout import table_console

    return table_console(out)


def error(message: str) -> None:
    """`error: message` on stderr, one line (`message` is rich markup: escape what is not)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Say `message` as the one-line error and exit with `code` (2, a usage error, by default)."""
    from rich.markup import escape

    error(escape(message))
    raise typer.Exit(code)
