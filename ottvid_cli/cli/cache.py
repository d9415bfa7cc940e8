"""`ottvid cache ls|clear`: what a --cache-dir folder holds, and emptying it (docs/reuse.md, "On disk").

Registered in app.py. Only ottvid's own files are listed or deleted (NAME.json, NAME.safetensors and
their temporary files, NAME a 32-digit hex hash); anything else in the folder is left alone.
"""

from __future__ import annotations

import json
import os
import time

import typer

from .errors import PipeConsole, fail, out
from .help import HelpCommand, HelpGroup
from .request import cache_path

cache_app = typer.Typer(cls=HelpGroup, help="The prepared-video cache on disk (--cache-dir): list it, empty it.",
                        no_args_is_help=True)

FOLDER = typer.Option("default", "--cache-dir", metavar="DIR", show_default="$XDG_CACHE_HOME/ottvid (~/.cache/ottvid)",
                      help="The cache folder ('default' is the default folder).")


def _videos(n: int) -> str:
    return f"{n} cached video{'' if n == 1 else 's'}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _existing(cache_dir: str) -> str:
    """The folder --cache-dir names; one named by the user must exist (a typo would otherwise read as
    an empty cache). The default folder may not exist yet: nothing was cached there."""
    folder = cache_path(cache_dir)
    if cache_dir != "default" and not os.path.isdir(folder):
        fail(f"--cache-dir: no such folder: {cache_dir}")
    return folder


@cache_app.command("ls", cls=HelpCommand)
def list_entries(
    cache_dir: str = FOLDER,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout and nothing else there."),
) -> None:
    """List the cached videos, least recently used first (the first to go when the folder is over --cache-max-gb)."""
    from rich.table import Table

    from ..cache import disk_entries

    folder = _existing(cache_dir)
    entries = disk_entries(folder, details=True)
    total = sum(e.bytes for e in entries)
    if as_json:
        typer.echo(json.dumps({"folder": folder, "entries": [e.to_dict() for e in entries], "bytes": total},
                              indent=2, ensure_ascii=False))
        return
    if not entries:
        out.print(f"{folder}: no cached videos", highlight=False, markup=False, soft_wrap=True)
        return
    table = Table(title=f"{folder}: {_videos(len(entries))}, {_size(total)}", title_justify="left")
    for column in ("last used", "size", "frames", "model", "video (when prepared)"):
        table.add_column(column, justify="right" if column in ("size", "frames") else "left", overflow="fold")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        video = e.video if e.complete else "(incomplete: a write in progress, or damaged)"
        if video == "":  # prepared by `ottvid serve` from an upload: there is no file to name
            video = "(no file: uploaded to a server)"
        table.add_row(when, _size(e.bytes), "-" if e.frames is None else str(e.frames), e.model or "-", video or "-")
    (out if out.is_terminal else PipeConsole(width=max(out.width, 200))).print(table)  # a file: no column cut


@cache_app.command("clear", cls=HelpCommand)
def clear(cache_dir: str = FOLDER) -> None:
    """Delete every cached video of the folder (ottvid's files only; the folder itself stays)."""
    from ..cache import clear_disk

    folder = _existing(cache_dir)
    try:
        count, freed = clear_disk(folder)
    except OSError as exc:
        fail(f"cannot clear {folder}: {exc.strerror or exc}", code=1)
    out.print(f"{folder}: deleted {_videos(count)}, {_size(freed)} freed", highlight=False, markup=False,
              soft_wrap=True)
