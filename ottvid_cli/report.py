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
    newline = f" + {tokens['newline']:,} newline" if tokens.get("newline") else ""
    table.add_row("into the LLM", f"{tokens['llm_input']:,}", "",
                  f"{tokens['visual_after']:,} visual + {tokens['text']:,} text{newline}")
    console.print(table)

    timings = Table(title=f"time (ms) on {result['device']}")
    names = ["decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate"]
    for name in names:
        timings.add_column(name, justify="right")
    timings.add_row(*(_ms(result["timings_ms"].get(n)) for n in names))
    console.print(timings)


def _cell(stat: dict[str, float] | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['median']:,.1f}\n[dim]{stat['min']:,.1f}-{stat['max']:,.1f}[/]"


def render_profile(data: dict[str, Any], console: Console) -> None:
    """One row per method / ratio: median (min-max) ms of each step, tokens, memory, FLOPs, speed-up."""
    rows = data["rows"]
    table = Table(title=f"{data['model']} on {data['device']}: {data['frames']['count']} frames, "
                        f"{data['frames']['duration']:.1f} s")
    columns = ["run", "visual tokens", "LLM input", "decode", "preprocess", "vision", "saliency", "compression",
               "prefill", "TTFT", "speed-up", "peak MB", "prefill TFLOPs", "vision TFLOPs"]
    for name in columns:
        table.add_column(name, justify="left" if name == "run" else "right")
    for row in rows:
        t = row["timings_ms"]
        label = "vanilla" if row["method"] == "none" else f"OTT-Vid {row['ratio']:g}"
        table.add_row(label, f"{row['visual_tokens']:,}", f"{row['llm_input_tokens']:,}",
                      *(_cell(t.get(k)) for k in ("decode", "preprocess", "vision", "saliency", "compression",
                                                  "prefill", "ttft")),
                      f"{row['ttft_speedup']:.2f}x", f"{row['peak_memory_mb']:,.0f}",
                      f"{row['prefill_tflops']:.3g}", f"{row['vision_tflops']:.3g}")
    console.print(table)
    compressed = [r for r in rows if r["method"] == "ottvid"]
    if compressed:
        stages = Table(title="compression stages (median ms)")
        stages.add_column("ratio")
        names = [k.split(".", 1)[1] for k in compressed[0]["timings_ms"] if k.startswith("compression.")]
        for name in names:
            stages.add_column(name, justify="right")
        for row in compressed:
            stages.add_row(f"{row['ratio']:g}", *(f"{row['timings_ms'][f'compression.{n}']['median']:.1f}"
                                                 for n in names))
        console.print(stages)
    console.print(f"[dim]times in ms: median, then min-max of {data['repeats']} runs after {data['warmup']} "
                  f"warm-up; TTFT = vision + saliency + compression + prefill; memory: {rows[0]['memory_kind']}; "
                  f"TFLOPs from the model config (docs/profile.md)[/]")


def render_counts(data: dict[str, Any], ratio: float, gamma: float, console: Console) -> None:
    """`ottvid counts`: the tokens each stage keeps."""
    table = Table(title=f"OTT-Vid token counts at ratio {ratio:g} (gamma {gamma:g})")
    table.add_column("stage")
    table.add_column("tokens", justify="right")
    table.add_column("", justify="left")
    table.add_row("input", str(data["input"]), f"T={data['T']} groups x N={data['N']}")
    table.add_row("spatial selection", str(data["after_spatial"]), f"K={data['K']} per group (r_s={data['r_s']:.3f})")
    table.add_row("temporal merge/prune", f"-{data['B_tot']}",
                  f"B_tot over {max(data['T'] - 1, 0)} pairs (r_t={data['r_t']:.3f})")
    table.add_row("output", str(data["output"]), f"{data['output'] / data['input']:.1%} of the input")
    console.print(table)
