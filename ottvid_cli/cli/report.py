"""Rendering of run results for people (rich) and scripts (JSON). No computation happens here; the
tables keep to the width (`layout.py`)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .layout import print_table


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _times(stamps: list[float], limit: int = 12) -> str:
    shown = [f"{t:.2f}" for t in stamps[:limit]]
    more = f" … (+{len(stamps) - limit})" if len(stamps) > limit else ""
    return ", ".join(shown) + more


def render_run(result: dict[str, Any], console: Console, streamed: bool = False, choices: bool = False,
               load: bool = True, cache_dir: str | None = None, server: str | None = None) -> None:
    """The answer (or span) first, then what was sampled, whether the video came from the cache, how
    many tokens each stage kept, and timings.
    streamed: the reply's text was already printed as it was generated (then it is not repeated);
    choices: the question had options (-c), so a reply without a readable letter says so;
    load: show the model's loading time (once per process: the first question's report);
    cache_dir: the --cache-dir folder a "disk" cache hit came from;
    server: the run was an `ottvid serve` at this address (its cache, its model loaded at its start)."""
    _render_answer(result, console, streamed, choices)

    frames = result["frames"]
    sampled = Table(title="video", show_header=False, box=None, pad_edge=False)
    sampled.add_column(overflow="fold")
    sampled.add_column(overflow="fold")  # a long path folds too
    sampled.add_row("file", result["video"])
    sampled.add_row("duration", f"{frames['duration']:.2f} s")
    sampled.add_row("frames", f"{frames['count']} ({frames['frames_per_group']} per temporal group)")
    if frames.get("chunk_frames") and frames["chunk_frames"] < frames["count"]:  # a long video, chunk by chunk
        chunks = -(-frames["count"] // frames["chunk_frames"])
        sampled.add_row("prepared", f"in {chunks} chunks of {frames['chunk_frames']} frames")
    for note in frames.get("notes", []):
        sampled.add_row("", Text(note, style="yellow"))
    sampled.add_row("times (s)", _times(frames["timestamps"]))
    sampled.add_row("cache", _cache_words(result, cache_dir, server))
    print_table(console, sampled)

    tokens = result["tokens"]
    before = tokens["visual_before"]
    table = Table(title=f"visual tokens ({result['method']}, ratio {result['ratio']:g})")
    table.add_column("stage", overflow="fold")
    table.add_column("tokens", justify="right", overflow="fold")
    table.add_column("retention", justify="right", overflow="fold")
    table.add_column("", overflow="fold")
    table.add_row("vision encoder", f"{before:,}", "100.0%",
                  f"{tokens['groups']} groups x {tokens['per_group']} ({tokens['grid'][0]}x{tokens['grid'][1]})")
    c = result["compression"]
    if c is not None and "K" not in c:  # another method: one step, read from its assignment
        table.add_row(result["method"], f"{tokens['visual_after']:,}", f"{tokens['visual_after'] / before:.1%}",
                      f"{tokens['merges']} merged into kept tokens, {tokens['prunes']} dropped")
    elif c is not None:
        table.add_row("spatial selection", f"{tokens['after_spatial']:,}", f"{tokens['after_spatial'] / before:.1%}",
                      f"K={c['K']} per group")
        table.add_row("temporal merge / prune", f"{tokens['visual_after']:,}", f"{tokens['visual_after'] / before:.1%}",
                      f"{tokens['merges']} merged, {tokens['prunes']} pruned over {max(c['T'] - 1, 0)} pairs")
    newline = f" + {tokens['newline']:,} newline" if tokens.get("newline") else ""
    table.add_row("into the LLM", f"{tokens['llm_input']:,}", "",
                  f"{tokens['visual_after']:,} visual + {tokens['text']:,} text{newline}")
    print_table(console, table)

    timings = Table(title=f"time (ms) on {result['device']}" + (f" at {server}" if server else ""))
    first = load and server is None and result["timings_ms"].get("startup") is not None
    names = ["startup"] * first + ["load"] * (load and server is None) + ["decode", "preprocess", "vision", "saliency", "compression",
                                                    "prefill", "generate"]
    for name in names:
        timings.add_column(name, justify="right", overflow="fold")
    timings.add_row(*("cached" if result.get("cache_hit") and n in CACHED_STAGES else _ms(result["timings_ms"].get(n))
                      for n in names))
    captions = []
    if result["timings_ms"].get("warmup") is not None and server is None:  # first-call overheads, before the question
        captions.append(f"warm-up before the first question (first-call overheads): "
                        f"{_ms(result['timings_ms']['warmup'])} ms")
    if result["timings_ms"].get("wall") is not None:
        captions.append(_wall_words(result, first))
    if captions:
        timings.caption = "; ".join(captions)
    print_table(console, timings)
    if result.get("picture"):
        p = result["picture"]
        console.print(f"picture: {p['path']} ({p['width']}x{p['height']}, {p['tiles']} tiles)", highlight=False,
                      markup=False)


def _wall_words(result: dict[str, Any], first: bool) -> str:
    """The wall time and how it relates to the stages' sum (`clock.account`): decoding that ran beside
    the load (the sum exceeds wall by it; the decode figure is slower than alone, sharing the CPU), and
    time in no stage when it is more than a little."""
    timings = result["timings_ms"]
    since = "the command's start" if first else "the question"
    words = f"wall {_ms(timings['wall'])} ms from {since} to the last token"
    overlap = result.get("decode_overlap_ms")
    if overlap and overlap >= 1.0:
        words += (f"; decoding ran {_ms(overlap)} ms of its {_ms(timings.get('decode'))} beside the loading, so "
                  f"wall is that much below the stages' sum (sharing the CPU, it decodes slower than alone)")
    other = timings.get("other") or 0.0
    if other >= max(50.0, 0.05 * timings["wall"]):
        words += f"; {_ms(other)} ms in no stage"
    return words


CACHED_STAGES = ("decode", "preprocess", "vision", "saliency")  # what a cache hit skips


def _cache_words(result: dict[str, Any], cache_dir: str | None, server: str | None) -> str:
    """Whether the video came from the cache, and from which one, in words."""
    if not result.get("cache_hit"):
        return "miss: decoded and encoded for this question"
    whose = "the server's" if server else "the"
    if result.get("cache_source") == "disk":
        where = f"{whose} cache folder" + (f" {cache_dir}" if cache_dir and not server else "")
        return f"hit: the video came from {where} (prepared by an earlier run), not decoded or encoded again"
    return (f"hit: the video came from {whose} cache in memory (prepared by an earlier question), not decoded or "
            f"encoded again")


def render_show(data: dict[str, Any], console: Console) -> None:
    """`ottvid show`: what was written."""
    note = f", 1 group in {data['every']} shown" if data["every"] > 1 else ""
    console.print(f"wrote {data['path']}: {data['width']}x{data['height']}, {data['tiles']} tiles{note}; "
                  f"{data.get('method', 'ottvid')} kept {data['kept']} of {data['total']} tokens", highlight=False,
                  markup=False)
    for line in data.get("frames", {}).get("notes", []):
        console.print(f"frames: {line}", style="yellow", highlight=False, markup=False)


def _ms_short(value: float) -> str:
    """A time in ms: whole numbers from 1,000 up (the decimals would only widen the column)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.1f}"


def _cell(stat: dict[str, float] | None) -> str:
    if stat is None:
        return "-"
    return f"{_ms_short(stat['median'])}\n[dim]{_ms_short(stat['min'])}-{_ms_short(stat['max'])}[/]"


def _timing(key: str):
    return lambda row: _cell(row["timings_ms"].get(key))


# The profile table's rows: (label, the cell of one run).
_PROFILE_MEASURES = (
    ("visual tokens", lambda row: f"{row['visual_tokens']:,}"),
    ("LLM input", lambda row: f"{row['llm_input_tokens']:,}"),
    *((label, _timing(key)) for label, key in (("decode", "decode"), ("preprocess", "preprocess"),
                                               ("vision", "vision"), ("saliency", "saliency"),
                                               ("compression", "compression"), ("prefill", "prefill"),
                                               ("TTFT", "ttft"))),
    ("speed-up", lambda row: f"{row['ttft_speedup']:.2f}x"),
    ("peak MB", lambda row: f"{row['peak_memory_mb']:,.0f}"),
    ("prefill TFLOPs", lambda row: f"{row['prefill_tflops']:.3g}"),
    ("vision TFLOPs", lambda row: f"{row['vision_tflops']:.3g}"),
)


def render_profile(data: dict[str, Any], console: Console) -> None:
    """One column per run (vanilla, then each ratio), one row per measure: tokens, median and min-max
    ms of each step, speed-up, memory, FLOPs. Runs that do not fit the console's width side by side
    continue in a further table (`split_table`), so no number or word is cut."""
    rows = data["rows"]
    keyed = " (key frames only)" if data["frames"].get("keyframes") else ""
    title = (f"{data['model']} on {data['device']}: {data['frames']['count']} frames{keyed}, "
             f"{data['frames']['duration']:.1f} s")
    for note in data["frames"].get("notes", []):  # what was sampled, as ask's report says it
        console.print(f"frames: {note}", style="yellow", highlight=False, markup=False)
    runs = [(run_label(row), [cell(row) for _, cell in _PROFILE_MEASURES]) for row in rows]

    table = Table(title=title)
    table.add_column("", overflow="fold")
    for label, _ in runs:
        table.add_column(label, justify="right", overflow="fold")
    for m, (name, _) in enumerate(_PROFILE_MEASURES):
        table.add_row(name, *(cells[m] for _, cells in runs))
    print_table(console, table, keys=1)  # runs that do not fit side by side go on in a further table
    for method in dict.fromkeys(r["method"] for r in rows):  # each method's own stages, if it times them
        timed = [r for r in rows if r["method"] == method
                 and any(k.startswith("compression.") for k in r["timings_ms"])]
        if not timed:
            continue
        stages = Table(title=f"{run_label(timed[0]).rsplit(' ', 1)[0]} compression stages (median ms)")
        stages.add_column("ratio", overflow="fold")
        names = [k.split(".", 1)[1] for k in timed[0]["timings_ms"] if k.startswith("compression.")]
        for name in names:
            stages.add_column(name, justify="right", overflow="fold")
        for row in timed:
            stages.add_row(f"{row['ratio']:g}", *(_ms_short(row["timings_ms"][f"compression.{n}"]["median"])
                                                 if f"compression.{n}" in row["timings_ms"] else "-" for n in names))
        print_table(console, stages, keys=1)
    first = data.get("first_call_ms") or {}
    if first:  # the first calls of this process, against the warm medians
        warm = {"preprocess": rows[0]["timings_ms"].get("preprocess"), "vision": rows[0]["timings_ms"].get("vision"),
                "saliency": next((r["timings_ms"].get("saliency") for r in rows if "saliency" in r["timings_ms"]),
                                 None),
                "compression": next((r["timings_ms"].get("compression") for r in rows if r["method"] != "none"), None),
                "prefill": rows[0]["timings_ms"].get("prefill")}
        calls = Table(title="first calls in this process (ms)", title_justify="left")
        calls.add_column("step", overflow="fold")
        calls.add_column("first call", justify="right", overflow="fold")
        calls.add_column("warm (median)", justify="right", overflow="fold")
        for k, v in first.items():  # the difference is what the first-call overheads cost
            calls.add_row(k, _ms_short(v), _ms_short(warm[k]["median"]) if warm.get(k) else "-")
        print_table(console, calls, keys=1)
    console.print(f"[dim]times in ms: median, then min-max of {data['repeats']} runs after {data['warmup']} "
                  f"warm-up; preprocess, vision and saliency: one encoding shared by every run; TTFT = vision + "
                  f"saliency + compression + prefill; memory: {rows[0]['memory_kind']}; "
                  f"TFLOPs from the model config (docs/profile.md)[/]")


def run_label(row: dict[str, Any]) -> str:
    """A profile run's column heading: vanilla, OTT-Vid 0.1, fastvid 0.25, ..."""
    if row["method"] == "none":
        return "vanilla"
    return f"{'OTT-Vid' if row['method'] == 'ottvid' else row['method']} {row['ratio']:g}"


def render_methods(data: list[dict[str, Any]], console: Console) -> None:
    """`ottvid methods`: each registered method, what it does, its options and their defaults."""
    table = Table(title="compression methods (--method NAME, options with --method-arg key=value)")
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("what it does", overflow="fold", max_width=60)  # prose wraps, on a pipe too
    table.add_column("options (defaults)", overflow="fold", max_width=70)
    for method in data:
        options = ", ".join(f"{k}={v}" for k, v in method["defaults"].items() if k != "ratio") or "-"
        table.add_row(method["name"], method["summary"], options)
    print_table(console, table)
    console.print("[dim]--ratio sets every method's share kept (none keeps all); --preset official is ottvid's "
                  "(the authors' code); see docs/methods.md[/]")


def render_counts(data: dict[str, Any], ratio: float, gamma: float, console: Console) -> None:
    """`ottvid counts`: the tokens each stage keeps."""
    table = Table(title=f"OTT-Vid token counts at ratio {ratio:g} (gamma {gamma:g})")
    table.add_column("stage", overflow="fold")
    table.add_column("tokens", justify="right", overflow="fold")
    table.add_column("", justify="left", overflow="fold")
    table.add_row("input", str(data["input"]), f"T={data['T']} groups x N={data['N']}")
    table.add_row("spatial selection", str(data["after_spatial"]), f"K={data['K']} per group (r_s={data['r_s']:.3f})")
    table.add_row("temporal merge/prune", f"-{data['B_tot']}",
                  f"B_tot over {max(data['T'] - 1, 0)} pairs (r_t={data['r_t']:.3f})")
    table.add_row("output", str(data["output"]), f"{data['output'] / data['input']:.1%} of the input")
    print_table(console, table)


def _render_answer(result: dict[str, Any], console: Console, streamed: bool, choices: bool) -> None:
    """The answer's panel: the chosen letter or the span first, then the reply unless it was streamed."""
    if result["task"] == "ground":
        span = result["span"]
        if span is None:
            headline = f"no time span: {result.get('span_note') or 'none could be read from the reply'}"
        elif span[0] == span[1]:
            headline = f"{span[0]:.2f} s"
        else:
            headline = f"{span[0]:.2f} s - {span[1]:.2f} s"
        lines = [Text(headline, style="bold" if span is not None else "bold yellow")]
        if not streamed:
            lines.append(Text(f"model said: {result['answer']}", style="dim"))
    else:
        lines = [] if streamed else [Text(result["answer"] or "(empty reply)", style="bold")]
        if result.get("letter") is not None:
            lines.insert(0, Text(f"choice: {result['letter']}", style="bold green"))
        elif choices:
            lines.insert(0, Text("choice: no option letter could be read from the reply", style="bold yellow"))
    if result.get("random_model"):
        lines.append(Text(f"random model: {result.get('model')} has random weights, its answer means nothing "
                          f"(--model picks a real one)", style="yellow"))
    if lines:
        width = getattr(console, "table_width", None)  # in a pipe: within the tables' width, words whole
        console.print(Panel(Group(*lines), title="answer" if result["task"] == "ask" else "when", expand=False,
                            width=None if width is None else min(width, console.width,
                                                                 4 + max(line.cell_len for line in lines))))


UNKNOWN = "unknown"


def render_plain_run(result: dict[str, Any], console: Console, streamed: bool = False, choices: bool = False) -> None:
    """A run at a plain OpenAI-compatible server (`remote/openai_compat.py`): the answer as `render_run`
    shows it, then what the server returned; what it did not return is shown as unknown."""
    _render_answer(result, console, streamed, choices)
    server = result.get("server") or {}
    tokens = result["tokens"]

    def count(value: int | None) -> str:
        return UNKNOWN if value is None else f"{value:,}"

    table = Table(title=f"run at {server.get('url')} ({server.get('owned_by') or 'an OpenAI-compatible server'}, "
                        f"not ottvid serve)", show_header=False, box=None, pad_edge=False)
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    table.add_row("file", result["video"])
    table.add_row("model", result.get("model") or UNKNOWN)
    table.add_row("frames", f"{UNKNOWN}: the server samples them and does not say which")
    table.add_row("method, ratio", f"{UNKNOWN}: the server's, set when it started")
    table.add_row("visual tokens", f"{UNKNOWN}: the server does not report what it kept")
    table.add_row("into the LLM", f"{count(tokens.get('llm_input'))} tokens (the server's prompt_tokens: video + text)")
    table.add_row("generated", f"{count(tokens.get('generated'))} tokens")
    metrics = {k: v for k, v in (result.get("server_metrics") or {}).items() if isinstance(v, (int, float))}
    timed = ", ".join(f"{k.removesuffix('_ms')} {_ms(v)} ms" for k, v in metrics.items() if k.endswith("_ms"))
    table.add_row("time", f"the server's metrics: {timed}" if timed
                  else f"{UNKNOWN}: the server reports no stage times")
    print_table(console, table)
