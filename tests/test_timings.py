"""`timings_ms` adds up: the stages (with `startup` and `other`) less the decoding that ran beside the load
are the wall time; the report says the decoding overlapped only when it did, with how much."""

from __future__ import annotations

import json
import pathlib

import pytest

from ottvid_cli.cli.app import app
from tests.support.cli import runner

DATA = pathlib.Path(__file__).parent / "data"
STAGES = ("startup", "load", "warmup", "decode", "preprocess", "vision", "saliency", "compression", "prefill",
          "generate", "other")


def _run(*args) -> list[dict]:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return data if isinstance(data, list) else [data]


def _adds_up(data: dict) -> None:
    timings = data["timings_ms"]
    counted = sum(timings.get(k) or 0.0 for k in STAGES) - (data["decode_overlap_ms"] or 0.0)
    assert counted == pytest.approx(timings["wall"], rel=1e-9, abs=1e-6)
    assert timings["other"] >= 0


def test_the_stages_add_up_to_wall_when_decoding_overlaps_loading(tiny_qwen):
    first, second = _run("ask", DATA / "cockatoo.mp4", "What happens?", "Then?", "--model", tiny_qwen, "--json",
                         "--max-new-tokens", "2", "--frames", "8")
    assert first["decoded_while_loading"] is True
    assert 0 < first["decode_overlap_ms"] <= first["timings_ms"]["decode"]
    assert first["timings_ms"]["startup"] > 0 and first["timings_ms"]["load"] > 0
    _adds_up(first)
    # the second question: no startup, load or warm-up of its own; its wall from its own start
    assert second["timings_ms"]["startup"] is None and second["timings_ms"]["load"] is None
    assert "warmup" not in second["timings_ms"] and second["decode_overlap_ms"] is None
    _adds_up(second)


def test_without_early_decoding_there_is_no_overlap(tiny_qwen, tmp_path):
    data, = _run("ask", DATA / "realshort.mp4", "What?", "--model", tiny_qwen, "--json", "--max-new-tokens", "2",
                 "--frames", "8", "--cache-dir", tmp_path / "cache")
    assert data["decoded_while_loading"] is False and data["decode_overlap_ms"] is None
    _adds_up(data)


def test_the_text_report_names_the_overlap_only_when_there_was_one(tiny_qwen, tmp_path):
    overlapped = runner.invoke(app, ["ask", str(DATA / "realshort.mp4"), "What?", "--model", str(tiny_qwen),
                                     "--max-new-tokens", "2", "--frames", "8"])
    assert overlapped.exit_code == 0, overlapped.output
    said = " ".join(overlapped.stdout.split())
    assert "startup" in said and "from the command's start to the last token" in said
    assert "beside the loading" in said
    alone = runner.invoke(app, ["ask", str(DATA / "realshort.mp4"), "What?", "--model", str(tiny_qwen),
                                "--max-new-tokens", "2", "--frames", "8", "--cache-dir", str(tmp_path / "c")])
    assert alone.exit_code == 0, alone.output
    said = " ".join(alone.stdout.split())
    assert "from the command's start to the last token" in said and "beside the loading" not in said


def test_a_streamed_reply_cannot_drive_the_terminal():
    """A random model's reply may hold escape sequences; the streamed text shows them as U+FFFD."""
    from ottvid_cli.cli.progress import printable

    assert printable("a\x1b]0;title\x07b\rc\x9bd\te\nf") == "a\ufffd]0;title\ufffdb\ufffdc\ufffdd\te\nf"
