"""The `ottvid` command line: thin wiring from arguments to the library, rendered with rich."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from . import __version__

app = typer.Typer(
    name="ottvid",
    help="Ask questions about videos and find when things happen in them, with OTT-Vid token compression.",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ottvid {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """OTT-Vid: optimal-transport temporal token compression for Video-LLMs."""


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


@app.command()
def counts(
    groups: int = typer.Option(16, "--groups", "-t", help="Temporal groups T (Qwen2.5-VL: frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", help="Visual tokens per group N (e.g. 256 = 16x16)."),
    ratio: float = typer.Option(0.1, "--ratio", "-r", help="Retention ratio r in (0, 1]."),
    gamma: float = typer.Option(0.3, "--gamma", help="Temporal share: r_s = r^(1-gamma), r_t = r^gamma."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """How many visual tokens each OTT-Vid stage keeps, before running anything."""
    from .compression import OTTVidConfig, token_counts

    if groups < 1 or tokens < 1:
        _fail("--groups and --tokens must be >= 1")
    try:
        OTTVidConfig(ratio=ratio, gamma=gamma)
    except ValueError as exc:
        _fail(str(exc))
    c = token_counts(groups, tokens, ratio, gamma)
    spatial = groups * tokens if ratio >= 1 else groups * c.K
    data = {"T": groups, "N": tokens, "input": groups * tokens, "K": c.K, "after_spatial": spatial,
            "B_tot": c.B_tot, "output": spatial - c.B_tot, "M": c.M, "r_s": c.r_s, "r_t": c.r_t}
    if as_json:
        typer.echo(json.dumps(data))
        return
    table = Table(title=f"OTT-Vid token counts at ratio {ratio:g} (gamma {gamma:g})")
    table.add_column("stage")
    table.add_column("tokens", justify="right")
    table.add_column("", justify="left")
    table.add_row("input", str(data["input"]), f"T={groups} groups x N={tokens}")
    table.add_row("spatial selection", str(spatial), f"K={c.K} per group (r_s={c.r_s:.3f})")
    table.add_row("temporal merge/prune", f"-{c.B_tot}", f"B_tot over {max(groups - 1, 0)} pairs (r_t={c.r_t:.3f})")
    table.add_row("output", str(data["output"]), f"{data['output'] / data['input']:.1%} of the input")
    out.print(table)


def main() -> None:
    """Console-script entry point."""
    app()
