"""The Typer app: the root options (--version) and every command, registered in the order `--help`
lists them."""

from __future__ import annotations

import typer

from .. import __version__
from .errors import _OneLineErrors

app = typer.Typer(
    name="ottvid",
    cls=_OneLineErrors,
    help="Ask questions about videos and find when things happen in them, with OTT-Vid token compression.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ottvid {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """OTT-Vid: optimal-transport temporal token compression for Video-LLMs.

    Exit codes: 0 done, 1 the model or run failed, 2 bad arguments or input, 3 ground found no time
    span, 4 the answer was printed but the picture could not be written. Defaults for --model,
    --device, --dtype, --ratio and --frames come from OTTVID_MODEL and the config file
    (~/.config/ottvid/config.toml); flags win. See docs/cli.md.
    """




from . import ask, cache, convert, eval, methods, profile, serve

app.command()(profile.counts)
app.command("methods")(methods.list_methods)
app.command()(ask.ask)
app.command()(ask.ground)
app.command()(ask.chat)
app.command()(profile.show)
app.command()(profile.profile)
app.command()(serve.serve)
app.add_typer(convert.convert_app, name="convert")
app.command("eval")(eval.eval_command)
app.add_typer(cache.cache_app, name="cache")


def main() -> None:
    """Console-script entry point."""
    app()
