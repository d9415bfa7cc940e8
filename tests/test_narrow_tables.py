"""Tables on a terminal narrower than they are: on an 80-column terminal `ottvid ask` printed its time
table with headings broken inside words (`preproce` / `ss`) and a time split across two lines (`12,531.`
/ `7`). Every table keeps to the width with each word and number whole: its columns share out the width
they can give up, and columns that cannot fit side by side go on in a further table. With no terminal
known (a script's pipe) tables keep to 80 columns, the same for every question of a run."""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from ottvid_cli.cli import app
from ottvid_cli.cli.layout import print_table
from ottvid_cli.cli.report import render_profile, render_run
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"
VIDEO = DATA / "bikes.mp4"
STAGES = {"startup", "load", "decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate"}
MS = re.compile(r"\d{1,3}(,\d{3})*\.\d")  # a time as the report writes it: 12,531.7
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX = "┏┃┡│└┗┣┠╇┳┻━─"


def on_terminal(args: list[str], columns: int) -> str:
    """stdout of `args` run on a pseudo-terminal `columns` wide (no COLUMNS in the environment), colour
    codes taken out."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 600)
            if not ready:
                proc.kill()
                pytest.fail("the command printed nothing for 10 minutes")
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # the terminal's other end closed: the command is done
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        stderr = proc.communicate()[1]
    assert proc.returncode == 0, stderr.decode(errors="replace")
    return ANSI.sub("", b"".join(chunks).decode(errors="replace").replace("\r\n", "\n"))


def shown(text: str) -> str:
    """The report from its video table on (the streamed reply before it is the model's text, whatever
    its length)."""
    lines = text.splitlines()
    return "\n".join(lines[next(i for i, line in enumerate(lines) if line.strip() == "video"):])


def section(text: str, title: str) -> list[str]:
    """The lines of the table titled `title` (all its parts when it was split), from its title on."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    end = start + 1
    while end < len(lines) and lines[end].strip()[:1] in tuple(BOX):
        end += 1
    return lines[start + 1:end]


def cells(lines: list[str], edge: str) -> list[str]:
    """The non-empty cells of the lines that begin with `edge` (│ for rows, ┃ for headings)."""
    return [cell.strip() for line in lines if line.strip().startswith(edge)
            for cell in line.strip().strip(edge).split(edge) if cell.strip()]


def assert_time_table_whole(lines: list[str]) -> None:
    """Every heading a whole stage name and every cell a whole time: nothing broken across lines."""
    headings, values = cells(lines, "┃"), cells(lines, "│")
    assert set(headings) <= STAGES and STAGES - {"startup", "load"} <= set(headings), headings
    assert values and all(MS.fullmatch(v) or v in ("cached", "-") for v in values), values


@pytest.mark.parametrize("columns", [80, 60])
def test_ask_on_a_narrow_terminal_breaks_no_heading_and_no_number(tiny_qwen, columns):
    text = on_terminal([sys.executable, "-m", "ottvid_cli", "ask", str(VIDEO), "What happens?", "--model",
                        str(tiny_qwen), "--frames", "8", "--max-new-tokens", "2", "--quiet"], columns)
    report = shown(text)
    assert max(cell_len(line) for line in report.splitlines()) <= columns, report
    assert_time_table_whole(section(report, "time (ms)"))
    words = set(report.replace("│", " ").replace("┃", " ").split())
    assert {"vision", "encoder", "spatial", "selection", "retention", "tokens"} <= words


def report(width: int, **changes) -> str:
    """`render_run`'s report of a made-up run with times in the tens of seconds, on a terminal `width` wide."""
    result = {"task": "ask", "answer": "A dog.", "letter": None, "video": str(VIDEO), "method": "ottvid",
              "ratio": 0.1, "device": "cpu", "compression": {"K": 12, "T": 16}, "cache_hit": False,
              "frames": {"duration": 10.0, "count": 32, "frames_per_group": 2, "timestamps": [0.1 * i for i in range(32)]},
              "tokens": {"visual_before": 960, "visual_after": 96, "after_spatial": 192, "groups": 16, "per_group": 60,
                         "grid": [5, 12], "merges": 31, "prunes": 65, "llm_input": 125, "text": 29},
              "timings_ms": {k: 12531.66 + 1000 * n for n, k in enumerate(["load", "decode", "preprocess", "vision",
                                                                         "saliency", "compression", "prefill",
                                                                         "generate", "wall"])}}
    result.update(changes)
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    render_run(result, console)
    return console.file.getvalue()


@pytest.mark.parametrize("width", [80, 60, 40])
def test_long_times_stay_whole_at_any_width(width):
    text = report(width)
    assert max(cell_len(line) for line in text.splitlines()) <= width
    lines = section(text, "time (ms)")
    assert_time_table_whole(lines)
    assert sorted(cells(lines, "│")) == sorted(f"{12531.66 + 1000 * n:,.1f}" for n in range(8))


def profile_data(ratios) -> dict:
    """What `profile --json` returns, times in the tens of seconds (a 7B model on a long clip)."""
    def stat(median: float) -> dict:
        return {"median": median, "min": median - 237.4, "max": median + 662.6}

    stages = ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge")
    rows = []
    for i, ratio in enumerate((1.0, *ratios)):
        timings = {"decode": stat(1234.4), "preprocess": stat(412.3), "vision": stat(10234.4),
                   "prefill": stat(23456.7 * ratio), "ttft": stat(12637.9 + 23456.7 * ratio)}
        if i:
            timings.update({"saliency": stat(12.3), "compression": stat(45.6 + i),
                            **{f"compression.{s}": stat(1.5 + k) for k, s in enumerate(stages)}})
        rows.append({"method": "ottvid" if i else "none", "ratio": ratio, "visual_tokens": round(16384 * ratio),
                     "llm_input_tokens": round(16384 * ratio) + 57, "timings_ms": timings,
                     "ttft_ms": timings["ttft"]["median"], "ttft_speedup": 1.0 + i, "peak_memory_mb": 63456.0 - i,
                     "memory_kind": "cuda max allocated", "prefill_tflops": 261.0 * ratio, "vision_tflops": 98.7})
    return {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "device": "NVIDIA H100 80GB HBM3",
            "frames": {"count": 768, "duration": 384.0}, "repeats": 5, "warmup": 1, "rows": rows}


@pytest.mark.parametrize("width", [80, 60])
def test_profile_tables_stay_whole_on_a_narrow_terminal(width):
    ratios = (0.1, 0.15, 0.2, 0.25)
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    render_profile(profile_data(ratios), console)
    text = console.file.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= width
    headings = cells(text.splitlines(), "┃")
    for label in ["vanilla", *(f"OTT-Vid {r:g}" for r in ratios), "similarity", "sinkhorn", "merge"]:
        assert label in headings, label
    rows = cells(text.splitlines(), "│")
    assert rows.count("visual tokens") >= 2  # the runs go on in a further table, its row labels repeated
    assert all(f"{m - 237.4:,.0f}-{m + 662.6:,.0f}" in rows for m in (12637.9 + 23456.7 * r for r in (1.0, *ratios)))


def test_a_table_too_wide_goes_on_in_a_further_table_with_its_row_labels():
    table = Table(title="wide")
    table.add_column("run")
    for n in range(12):
        table.add_column(f"column{n}", justify="right")
    for row in ("first", "second"):
        table.add_row(row, *(f"{123456.7 + n:,.1f}" for n in range(12)))
    console = Console(file=io.StringIO(), width=60, force_terminal=True, color_system=None)
    print_table(console, table)
    lines = console.file.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= 60
    assert sorted(c for c in cells(lines, "┃") if c != "run") == sorted(f"column{n}" for n in range(12))
    body = cells(lines, "│")
    assert body.count("first") == body.count("second") > 1
    assert sorted(c for c in body if c not in ("first", "second")) == sorted(
        f"{123456.7 + n:,.1f}" for n in range(12) for _ in range(2))
    assert sum("wide" in line for line in lines) == 1  # the title once, above the first part


def test_every_question_of_a_piped_run_keeps_to_80_columns(tiny_qwen):
    """Two questions piped, no terminal width known: the second's video table said where the cache hit
    came from in one 119-column row against 89 for the first; every table of both keeps to 80 columns."""
    result = runner.invoke(app, ["ask", str(VIDEO), "What happens?", "Who rides?", "--model", str(tiny_qwen),
                                 "--frames", "8", "--max-new-tokens", "2", "--quiet"], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    first, second = result.stdout.split("question 2:")
    for text in (first, second):
        lines = shown(text).splitlines()
        assert max(cell_len(line) for line in lines) <= 80, "\n".join(lines)
        assert_time_table_whole(section("\n".join(lines), "time (ms)"))
    assert "hit: the video came from the cache in memory (prepared by an earlier question)" in " ".join(second.split())
