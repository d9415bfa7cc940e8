"""Rendering of run results for people (rich) and scripts (JSON). No computation happens here."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _times(stamps: list[float], limit: int = 12) -> str:
    shown = [f"{t:.2f}" for t in stamps[:limit]]
    more = f" … (+{len(stamps) - limit})" if len(stamps) > limit else ""
    return ", ".join(shown) + more


def render_run(result: dict[str, Any], console: Console) -> None:
    """The answer (or span) first, then what was sampled, how many tokens each stage kept, and timings."""
    if result["task"] == "ground":
        span = result["span"]
        headline = (f"{span[0]:.2f} s - {span[1]:.2f} s" if span is not None
                    else "no time span could be read from the model's reply")
        body = Group(Text(headline, style="bold"), Text(f"model said: {result['answer']}", style="dim"))
    else:
        lines = [Text(result["answer"] or "(empty reply)", style="bold")]
        if result.get("letter") is not None:
            lines.insert(0, Text(f"choice: {result['letter']}", style="bold green"))
        body = Group(*lines)
    console.print(Panel(body, title="answer" if result["task"] == "ask" else "when", expand=False))

    frames = result["frames"]
    sampled = Table(title="video", show_header=False, box=None, pad_edge=False)
    sampled.add_row("file", result["video"])
    sampled.add_row("duration", f"{frames['duration']:.2f} s")
    sampled.add_row("frames", f"{frames['count']} ({frames['frames_per_group']} per temporal group)")
    sampled.add_row("times (s)", _times(frames["timestamps"]))
    console.print(sampled)

    tokens = result["tokens"]
    before = tokens["visual_before"]
    table = Table(title=f"visual tokens ({result['method']}, ratio {result['ratio']:g})")
    table.add_column("stage")
    table.add_column("tokens", justify="right")
    table.add_column("retention", justify="right")
    table.add_column("")
    table.add_row("vision encoder", f"{before:,}", "100.0%",
                  f"{tokens['groups']} groups x {tokens['per_group']} ({tokens['grid'][0]}x{tokens['grid'][1]})")
    if result["compression"] is not None:
        c = result["compression"]
        table.add_row("spatial selection", f"{tokens['after_spatial']:,}", f"{tokens['after_spatial'] / before:.1%}",
                      f"K={c['K']} per group")
        table.add_row("temporal merge / prune", f"{tokens['visual_after']:,}", f"{tokens['visual_after'] / before:.1%}",
                      f"{tokens['merges']} merged, {tokens['prunes']} pruned over {max(c['T'] - 1, 0)} pairs")
    table.add_row("into the LLM", f"{tokens['llm_input']:,}", "",
                  f"{tokens['visual_after']:,} visual + {tokens['text']:,} text")
    console.print(table)

    timings = Table(title=f"time (ms) on {result['device']}")
    names = ["decode", "preprocess", "vision", "compression", "prefill", "generate"]
    for name in names:
        timings.add_column(name, justify="right")
    timings.add_row(*(_ms(result["timings_ms"].get(n)) for n in names))
    console.print(timings)
