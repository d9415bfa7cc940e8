"""benchmarks/vllm.py --concurrent: its options, the generated clips, the rounds' order, the table and its
JSON, without vLLM; and, slow, the whole mode with --smoke in the vLLM environment."""

import io
import json
import subprocess
import sys

import pytest

from benchmarks import ROOT, environ
from benchmarks import vllm as bench
from benchmarks import vllm_concurrent as concurrent


def _env():
    return {"device": "cpu", "device_name": "x86_64", "dtype": "float32", "torch": "2.13.0", "transformers": "5.19.0",
            "python": "3.11", "threads": 2, "vllm": "0.32.0"}


def _round(i, wall, ttfts, video):
    return {"round": i, "start_ms": 30000.0, "wall_ms": wall, "environment": _env(), "load": 1.0 + i,
            "requests": [{"ttft_ms": t, "engine_ms": t - 100.0, "prompt_tokens": video + 33, "video_tokens": video}
                         for t in ttfts]}


def _measurements():
    """What measure_concurrent() returns, in its shape: 2 requests, 3 rounds, numbers chosen so that every
    median, mean and ratio is known."""
    clip = {"count": 24, "decoded_size": [336, 336], "size": [336, 336]}
    return {"model": "random Qwen2.5-VL-7B shape, 2 LLM layers, 2 vision blocks, float32",
            "clips": [{"name": f"generated clip {i}", **clip} for i in range(2)], "concurrent": 2, "rounds": 3,
            "rate": 0.9, "warmup": 1, "threads_bind": "0-1",
            "runs": {"stock": [_round(1, 60000.0, [50000.0, 58000.0], 1728), _round(2, 56000.0, [50000.0, 54000.0], 1728),
                               _round(3, 58000.0, [52000.0, 56000.0], 1728)],
                     "evs": [_round(1, 24000.0, [20000.0, 22000.0], 172), _round(2, 26000.0, [21000.0, 23000.0], 172),
                             _round(3, 25000.0, [20000.0, 24000.0], 172)],
                     "ottvid": [_round(1, 30000.0, [25000.0, 29000.0], 173), _round(2, 40000.0, [30000.0, 34000.0], 173),
                                _round(3, 32500.0, [26000.0, 30000.0], 173)]}}


def test_concurrent_options():
    p = bench.parser()
    assert p.parse_args([]).concurrent is None  # the one-request mode stays the default
    args = p.parse_args(["--concurrent"])
    assert (args.concurrent, args.rounds, args.clip_size, args.videos) == (8, 3, 336, None)
    assert p.parse_args(["--concurrent", "3", "--rounds", "1"]).concurrent == 3
    assert p.parse_args(["--json"]).json == "-" and p.parse_args(["--json", "m.json"]).json == "m.json"


def bench_command(*argv, python=sys.executable):
    return [str(python), "-m", "benchmarks.vllm", *argv]


@pytest.mark.parametrize("argv, message", [
    (["--concurrent", "0"], "--concurrent must be >= 1, got 0"),
    (["--concurrent", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["--concurrent", "--clip-size", "8"], "--clip-size must be >= 28"),
    (["--concurrent", "--pipeline"], "--pipeline does not combine with --concurrent"),
    (["--concurrent", "2", "--videos", "tests/data/cockatoo.mp4"], "--videos names 1 clips; --concurrent 2 needs"),
    (["--concurrent", "2", "--videos", "tests/data/cockatoo.mp4", "tests/data/cockatoo.mp4"], "names a clip twice"),
    (["--concurrent", "1", "--videos", "/nonexistent/a.mp4"], "no video file at /nonexistent/a.mp4"),
    (["--concurrent", "--json", "/nonexistent/folder/m.json"], "no folder for --json"),
])
def test_bad_concurrent_options_are_refused_in_one_line_before_any_work(argv, message):
    run = subprocess.run(bench_command(*argv), capture_output=True, text=True, timeout=120, cwd=ROOT, env=environ())
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert message in " ".join(run.stderr.split())


def test_generated_clips_differ_by_seed_and_repeat_with_it():
    a, timestamps, duration = concurrent.synthetic_clip(0, 6, 56)
    again, _, _ = concurrent.synthetic_clip(0, 6, 56)
    b, _, _ = concurrent.synthetic_clip(1, 6, 56)
    assert a.shape == (6, 56, 56, 3) and a.dtype.name == "uint8"
    assert (a == again).all() and (a != b).mean() > 0.5
    assert (a[0] != a[-1]).mean() > 0.1  # the clip moves
    assert timestamps == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5] and duration == 3.0


def test_rounds_rotate_the_runs_turns():
    runs = ["stock", "evs", "ottvid"]
    assert [concurrent.order(runs, i) for i in range(4)] == [
        ["stock", "evs", "ottvid"], ["evs", "ottvid", "stock"], ["ottvid", "stock", "evs"], ["stock", "evs", "ottvid"]]
    assert concurrent.order(["ottvid"], 5) == ["ottvid"]


def test_rows_take_the_median_round_and_compare_with_stock_and_evs():
    rows = {row["name"]: row for row in concurrent.rows(_measurements())}
    assert list(rows) == ["stock", "evs", "ottvid"]
    assert [rows[n]["wall_ms"] for n in rows] == [58000.0, 25000.0, 32500.0]
    assert rows["ottvid"]["walls_ms"] == [30000.0, 40000.0, 32500.0]
    assert rows["evs"]["requests_per_s"] == pytest.approx(2 / 25.0)
    assert rows["ottvid"]["ttft_ms"] == 28000.0  # round means 27000, 32000, 28000
    assert rows["ottvid"]["vs_evs"] == pytest.approx(1.3) and rows["evs"]["vs_evs"] == 1.0
    assert rows["evs"]["speedup"] == pytest.approx(58 / 25)
    assert rows["ottvid"]["video_tokens"] == 173 and rows["stock"]["load"] == 4.0
    assert concurrent.ottvid_over_evs(_measurements()) == pytest.approx(1.3)
    only = {**_measurements(), "runs": {"ottvid": _measurements()["runs"]["ottvid"]}}
    assert concurrent.ottvid_over_evs(only) is None


def test_table_and_json_from_saved_measurements(tmp_path, capsys):
    saved = tmp_path / "m.json"
    saved.write_text(json.dumps(_measurements()))
    again = tmp_path / "again.json"
    bench.main(["--table", str(saved), "--json", str(again)])
    out = capsys.readouterr().out
    for text in ("2 concurrent requests", "2 different clips, 24 frames at 336x336", "median of 3 rounds",
                 "vLLM + EVS (its own)", "q = 0.9", "32.5", "30.0 / 40.0 / 32.5", "0.080", "1.30x", "2.32x",
                 "OTT-Vid / EVS wall time: 1.30x", "vLLM 0.32.0", "2 CPU threads"):
        assert text in " ".join(out.split()), text
    assert json.loads(again.read_text()) == _measurements()


@pytest.mark.slow
def test_concurrent_smoke_in_the_vllm_environment(vllm_env, tmp_path):
    """--concurrent on the tiny model (head_dim 64) in vLLM's environment: every round of every run answers
    all the requests (one round), with the token counts each run asks for; no time is asserted."""
    out = tmp_path / "m.json"
    argv = ["--smoke", "--concurrent", "2", "--rounds", "1", "--frames", "8", "--clip-size", "112", "--json", str(out)]
    run = subprocess.run(bench_command(*argv, python=vllm_env.python), capture_output=True, text=True, timeout=900,
                         cwd=ROOT, env=environ())
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [c["name"] for c in data["clips"]] == ["generated clip 0", "generated clip 1"]
    for name in bench.RUNS:
        assert [r["round"] for r in data["runs"][name]] == [1]
        for r in data["runs"][name]:
            assert len(r["requests"]) == 2 and r["wall_ms"] > 0
            assert all(q["ttft_ms"] > 0 and q["prompt_tokens"] > q["video_tokens"] for q in r["requests"])
    tokens = {name: data["runs"][name][0]["requests"][0]["video_tokens"] for name in bench.RUNS}
    v = tokens["stock"]
    assert tokens["ottvid"] == round(0.1 * v) and tokens["ottvid"] < tokens["evs"] < v
    assert data["ottvid_over_evs"] > 0
    assert "OTT-Vid / EVS wall time" in run.stdout
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    console.print(concurrent.render(data))
    assert "vLLM + OTT-Vid (plugin)" in console.file.getvalue()
