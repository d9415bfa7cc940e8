"""`ottvid methods`: the compression methods, their options and defaults."""

from __future__ import annotations

import typer

from ..method_catalog import PRESETS
from .errors import tables
from .options import Json


def list_methods(as_json: Json = False) -> None:
    """List the compression methods (--method), their options (--method-arg) and defaults."""
    from ..compression import methods
    from .report import render_methods, to_json

    data = []
    for name in methods.names():
        method = methods.get(name)
        entry = {"name": name, "summary": method.summary, "config": method.config.__name__,
                 "defaults": method.defaults()}
        if name == "ottvid":
            entry["presets"] = list(PRESETS)
        data.append(entry)
    if as_json:
        typer.echo(to_json(data))
        return
    render_methods(data, tables())

