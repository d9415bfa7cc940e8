"""The Typer app: the root options (--version) and every command, registered in the order `--help`
lists them."""

from __future__ import annotations

import typer

from .. import __version__
from .errors import OneLineErrors

app = typer.Typer(
    name="ottvid",
    cls=OneLineErrors,
    help="Ask questions about videos and find when things happen in them, with OTT-Vid token compression.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 done, 1 the model or run failed, 2 bad arguments or input, 3 ground found no time "
           "span, 4 the answer was printed but the picture could not be written. Defaults for --model, --device, "
           "--dtype, --ratio and --frames come from OTTVID_MODEL and the config file "
           "(~/.config/ottvid/config.toml); flags win. See docs/cli.md.",
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

from .help import HelpCommand

_USE, _LOOK, _FILES = "Ask and answer", "Look inside and measure", "Models and files"
app.command(cls=HelpCommand, rich_help_panel=_USE)(ask.ask)
app.command(cls=HelpCommand, rich_help_panel=_USE)(ask.ground)
app.command(cls=HelpCommand, rich_help_panel=_USE)(ask.chat)
app.command(cls=HelpCommand, rich_help_panel=_USE)(serve.serve)
app.command(cls=HelpCommand, rich_help_panel=_LOOK)(profile.show)
app.command(cls=HelpCommand, rich_help_panel=_LOOK)(profile.profile)
app.command("eval", cls=HelpCommand, rich_help_panel=_LOOK)(eval.eval_command)
app.command(cls=HelpCommand, rich_help_panel=_LOOK)(profile.counts)
app.command("methods", cls=HelpCommand, rich_help_panel=_LOOK)(methods.list_methods)
app.add_typer(convert.convert_app, name="convert", rich_help_panel=_FILES)
app.add_typer(cache.cache_app, name="cache", rich_help_panel=_FILES)

def main() -> None:
    """Console-script entry point (also `python -m ottvid_cli`, which the help and errors call ottvid)."""
    app(prog_name="ottvid")
