"""`ottvid eval` through the real CLI: bad input refused before the model loads, a run, its rescore,
and two torchrun processes (gloo on the CPU) giving the same records and scores as one process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ottvid_cli.eval import parse_shard
from tests.support.cli import invoke_eval as invoke

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
HUB_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"  # never loaded: every case below is refused first


def refused(result, *parts):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_bad_input_is_one_line_before_the_model_loads(tmp_path):
    refused(invoke("nosuch", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--model", HUB_MODEL),
            "unknown benchmark 'nosuch'", "known: mvbench, videomme")
    refused(invoke("jsonl", "--data", tmp_path / "none.jsonl", "--videos", DATA, "--model", HUB_MODEL),
            "none.jsonl: annotation file not found")
    bad = tmp_path / "bad.jsonl"
    good = '{"id": "a", "video": "yoga.mp4", "question": "Q?", "options": ["x", "y"], "answer": "A"}'
    bad.write_text(good + '\n{"id": 2\n')
    refused(invoke("jsonl", "--data", bad, "--videos", DATA, "--model", HUB_MODEL), "bad.jsonl: line 2")
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(DATA / "yoga.mp4", videos)
    refused(invoke("jsonl", "--data", EVAL / "custom.jsonl", "--videos", videos, "--model", HUB_MODEL),
            "2 of 3 samples have no video under", "--skip-missing")
    refused(invoke("jsonl", "--data", EVAL / "custom.jsonl", "--model", HUB_MODEL), "--videos")
    refused(invoke("jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--shard", "2/2"), "--shard")
    refused(invoke("jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--method", "best"), "--method")
    refused(invoke("--rescore", tmp_path / "nothing"), "run folder not found")


def test_parse_shard():
    assert parse_shard("1/4", {}) == (1, 4, False)
    assert parse_shard(None, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == (1, 2, True)
    assert parse_shard(None, {}) == (0, 1, False)


def test_a_run_in_which_no_sample_could_be_evaluated_keeps_its_metrics_and_exits_1(tiny_qwen, tmp_path):
    """Charades-STA with both videos missing: R@0.3/0.5/0.7 and mIoU (not accuracy), exit 1 with one line;
    run again, the finished run is scored without loading the model."""
    empty = tmp_path / "videos"
    empty.mkdir()
    args = ["charades", "--data", EVAL / "charades_sta_test.txt", "--videos", empty, "--limit", "2", "--skip-missing",
            "--model", tiny_qwen, "--out", tmp_path / "run", "--json"]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    (only,) = summary["results"]
    assert only["count"] == only["errors"] == 2
    assert set(only["metrics"]) == {"R@0.3", "R@0.5", "R@0.7", "mIoU"}
    said = [line for line in result.stderr.splitlines() if "error:" in line or "hold an error" in line]
    assert len(said) == 1 and said[0].startswith("error: no sample could be evaluated: all 2 records"), result.stderr
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 2  # the records are kept
    again = invoke(*args)
    assert again.exit_code == 1 and json.loads(again.stdout)["results"] == summary["results"]
    assert "loading" not in again.stderr and "no model loaded" in again.stderr
    rescored = invoke("--rescore", tmp_path / "run", "--json")
    assert json.loads(rescored.stdout)["results"][0]["metrics"] == only["metrics"]


def run_args(tiny_qwen, out):
    return ["jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--model", tiny_qwen, "--method", "none",
            "--method", "ottvid", "--ratio", "0.25", "--max-frames", "4", "--out", out, "--json", "--quiet"]


def keys_and_scores(out):
    lines = (Path(out) / "samples.jsonl").read_text().splitlines()
    return sorted((r["id"], r["method"], r["ratio"], r["reply"], r["score"]) for r in map(json.loads, lines))


def test_run_resume_rescore_and_torchrun(tiny_qwen, tmp_path):
    single = tmp_path / "single"
    result = invoke(*run_args(tiny_qwen, single))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [(r["method"], r["ratio"], r["count"], r["errors"]) for r in summary["results"]] == [
        ("none", 1.0, 3, 0), ("ottvid", 0.25, 3, 0)]
    config = json.loads((single / "config.json").read_text())
    lmms = "lmms-eval's for the model"  # Qwen2.5-VL: qwen-vl-utils' rounded linspace
    assert config["sampling"] == {"mc": {"frames": 4, "fps": None, "max_frames": None, "rule": lmms, "pixels": lmms},
                                  "grounding": {"frames": None, "fps": 2.0, "max_frames": 4, "rule": lmms,
                                                "pixels": lmms}}
    assert config["methods"] == ["none", "ottvid"] and config["ratios"] == [0.25] and config["max_frames"] == 4
    lines = (single / "samples.jsonl").read_text()
    again = invoke(*run_args(tiny_qwen, single))  # nothing left to do: no new line
    assert again.exit_code == 0 and (single / "samples.jsonl").read_text() == lines
    refused(invoke(*run_args(tiny_qwen, single)[:-4], "--frames", "8", "--out", single), "config.json",
            "holds a run with other settings (frames unset there, 8 now;")
    rescored = invoke("--rescore", single, "--json")
    assert rescored.exit_code == 0 and json.loads(rescored.stdout)["results"] == summary["results"]
    table = invoke("--rescore", single)
    assert "ottvid" in table.stdout and "accuracy" in table.stdout and "relative" in table.stdout

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    sharded = tmp_path / "sharded"
    command = [str(torchrun), "--nproc-per-node", "2", "--standalone", "-m", "ottvid_cli", "eval",
               *map(str, run_args(tiny_qwen, sharded))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    merged = json.loads(done.stdout)  # only rank 0 prints
    assert not list(sharded.glob("samples.*-of-*.jsonl"))  # merged into samples.jsonl
    assert keys_and_scores(sharded) == keys_and_scores(single)
    assert merged["results"] == summary["results"]


def test_vllms_pruning_methods_run_as_eval_methods(tiny_qwen, tmp_path):
    """--method evs --method vidcom2: one record per sample and method, each at the exact retention, scored."""
    out = tmp_path / "run"
    result = invoke("jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--model", tiny_qwen, "--method", "evs",
                    "--method", "vidcom2", "--ratio", "0.25", "--max-frames", "4", "--out", out, "--json", "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [(r["method"], r["ratio"], r["count"], r["errors"]) for r in summary["results"]] == [
        ("evs", 0.25, 3, 0), ("vidcom2", 0.25, 3, 0)]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["method"]) for r in records) == sorted(
        (i, m) for i in ("q1", "q2", "g1") for m in ("evs", "vidcom2"))
    for r in records:
        tokens = r["tokens"]
        assert tokens["visual_after"] == round(0.25 * tokens["visual_before"]) and tokens["merges"] == 0
        assert tokens["prunes"] == tokens["visual_before"] - tokens["visual_after"]


def test_a_resumed_run_says_it_resumed_and_how_much_was_done(tiny_qwen, tmp_path):
    """A resume looked like a fresh run; now one line says what the folder held."""
    out = tmp_path / "run"
    args = ["jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--model", tiny_qwen, "--method", "none",
            "--max-frames", "4", "--out", out, "--json"]
    first = invoke(*args, "--limit", "1")
    assert first.exit_code == 0 and "resuming" not in first.stderr, first.output
    again = invoke(*args, "--limit", "2")
    assert again.exit_code == 0, again.output
    assert f"resuming {out}: 1 of 2 samples done already (1 records kept, 1 to run)" in again.stderr
    assert json.loads(again.stdout)["results"][0]["count"] == 2


def test_keyframes_only_when_named_and_recorded(tiny_qwen, tmp_path):
    """--keyframes changes what the protocol feeds the model: recorded in the run's config, and a resume
    that does not name it (or a run that does, in a folder made without it) is refused."""
    out = tmp_path / "keyed"
    args = ["jsonl", "--data", EVAL / "custom.jsonl", "--videos", DATA, "--model", tiny_qwen, "--method", "none",
            "--max-frames", "4", "--limit", "1", "--out", out, "--json", "--quiet"]
    result = invoke(*args, "--keyframes")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["keyframes"] is True
    again = invoke(*args)
    assert again.exit_code == 2 and "keyframes" in again.stderr
    plain = tmp_path / "plain"
    assert invoke(*args[:-4], "--out", plain, "--json", "--quiet").exit_code == 0
    assert "keyframes" not in json.loads((plain / "config.json").read_text())
