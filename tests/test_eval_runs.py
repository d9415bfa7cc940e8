"""The public API of a whole run (`ottvid_cli.eval`: plan_run, evaluate, resume, score_run, table) from
Python, without the command line, on a tiny Qwen2.5-VL: what `ottvid eval` calls, usable from a notebook."""

import json
from pathlib import Path

import pytest

from ottvid_cli.backbones import load_backbone
from ottvid_cli.eval import (
    EvalError,
    EvalRequest,
    evaluate,
    parse_shard,
    plan_run,
    request_of,
    resume,
    score_run,
    table,
)

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"


def request(model, out, **changes):
    settings = dict(bench="jsonl", data=str(EVAL / "custom.jsonl"), videos=str(DATA), model=str(model),
                    methods=["none", "ottvid"], ratios=[0.25], max_frames=4, limit=1, out=out and str(out))
    return EvalRequest(**{**settings, **changes})


def test_bad_requests_are_refused_before_any_model(tmp_path):
    with pytest.raises(EvalError, match="unknown benchmark 'nosuch'"):
        plan_run(request("m", tmp_path, bench="nosuch"))
    with pytest.raises(EvalError, match="give --frames or --fps, not both"):
        plan_run(request("m", tmp_path, frames=8, fps=1.0))
    with pytest.raises(EvalError, match="3 of 3 samples have no video under"):
        plan_run(request("m", tmp_path, videos=str(tmp_path), limit=None))
    with pytest.raises(EvalError, match="--sampling must be one of lmms"):
        plan_run(request("m", tmp_path, sampling="random"))
    with pytest.raises(EvalError, match="--shard must be I/N"):
        parse_shard("3/2", {})
    plan = plan_run(request("m", tmp_path, shard="1/2"))
    assert (plan.rank, plan.shards, plan.distributed) == (1, 2, False) and plan.config["limit"] == 1
    assert plan_run(request("Org/name", None)).out == str(Path("runs") / "jsonl-name")


def test_evaluate_resume_score_and_table_from_python(tiny_qwen, tmp_path):
    out = tmp_path / "run"
    loads, starts, progress = [], [], []

    def load(device):
        loads.append(device)
        return load_backbone(str(tiny_qwen), device=device)

    first = evaluate(request(tiny_qwen, out), load, on_start=starts.append, on_progress=progress.append)
    assert loads == ["auto"] and (starts[0].kept, starts[0].left, starts[0].samples) == (0, 2, 1)
    assert progress[-1].done == progress[-1].total == 1
    assert first.stats.records == 2 and first.summary["out"] == str(out)
    assert [(r["method"], r["count"]) for r in first.summary["results"]] == [("none", 1), ("ottvid", 1)]
    assert json.loads((out / "summary.json").read_text())["results"] == first.summary["results"]

    again = request_of(out)  # the request its config.json records
    assert (again.bench, again.methods, again.ratios, again.max_frames, again.limit, again.sampling) == (
        "jsonl", ["none", "ottvid"], [0.25], 4, 1, "lmms")
    assert plan_run(again).config == json.loads((out / "config.json").read_text())
    assert resume(out, load, on_start=starts.append).stats is None and len(loads) == 1  # nothing left: no model
    assert (starts[-1].done, starts[-1].left) == (1, 0)

    more = resume(out, load, limit=2, on_start=starts.append)  # one more sample: resumed, not redone
    assert (starts[-1].done, starts[-1].kept, starts[-1].left) == (1, 2, 2) and more.stats.records == 2
    assert [r["count"] for r in more.summary["results"]] == [2, 2]

    rescored = score_run(out)
    assert rescored["results"] == more.summary["results"] and len(rescored["rejudged"]) == 2
    rows = table([out])
    assert rows["model"] == str(tiny_qwen) and [r["method"] for r in rows["rows"]] == ["none", "ottvid"]
    with pytest.raises(EvalError, match="this folder holds a run with other settings"):
        resume(out, load, frames=8)
