"""benchmarks/vllm.py: its options, the engine each run asks for, and its table, without vLLM (the test
environment has none); and, slow, the whole script with --smoke in the vLLM environment (benchmarks/envs/vllm_env.py)."""

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.vllm"]  # run from the checkout: its root, not benchmarks/, first on sys.path
VIDEO = str(ROOT / "tests" / "data" / "cockatoo.mp4")


bench = importlib.import_module("benchmarks.vllm")


def _timed(ttft, engine, prompt, video):
    return {"generate_ms": ttft + 5.0, "ttft_ms": ttft, "engine_ms": engine, "prompt_tokens": prompt,
            "video_tokens": video}


def _env():
    return {"device": "cpu", "device_name": "x86_64", "dtype": "float32", "torch": "2.13.0", "transformers": "5.19.0",
            "python": "3.11", "threads": 2, "vllm": "0.32.0"}


def _measurements():
    """What measure() returns, in its shape (made by hand: numbers chosen so every speed-up is known)."""
    def run(ttft, engine, prompt, video):
        return {"start_ms": 30000.0, "runs": [_timed(ttft, engine, prompt, video)], "environment": _env(), "load": 1.5}

    pipeline_row = lambda method, ratio, ttft, prompt, video: {  # noqa: E731
        "method": method, "ratio": ratio, "llm_input_tokens": prompt, "visual_tokens": video,
        "timings_ms": {"ttft": {"median": ttft, "min": ttft, "max": ttft}}}
    return {"model": "random Qwen2.5-VL-7B shape, 2 LLM layers, 2 vision blocks, float32",
            "clip": {"path": VIDEO, "frames": 32, "size": [336, 588], "decoded_size": [720, 1280]},
            "rate": 0.9, "warmup": 1, "repeats": 1, "threads_bind": "0-1",
            "runs": {"stock": run(20000.0, 19000.0, 4065, 4032), "evs": run(8000.0, 7500.0, 436, 403),
                     "ottvid": run(5000.0, 4000.0, 436, 403),
                     "pipeline": {"start_ms": 9000.0, "environment": _env(),
                                  "rows": [pipeline_row("none", 1.0, 30000.0, 4065, 4032),
                                           pipeline_row("ottvid", 0.1, 12000.0, 436, 403)]}}}


def test_defaults_are_the_issue_s_comparison():
    args = bench.parser().parse_args([])
    assert args.runs == ["stock", "evs", "ottvid"] and args.rate == 0.9 and args.frames == 32
    assert (args.llm_layers, args.vision_blocks, args.dtype) == (2, 2, "float32")
    assert not args.pipeline and not args.smoke


def test_every_run_pays_in_full_and_asks_for_its_pruning():
    plan = {"model": "/m", "dtype": "float32", "max_model_len": 8192, "rate": 0.9}
    stock, evs, ottvid = (bench.engine_kwargs(name, plan) for name in ("stock", "evs", "ottvid"))
    for kwargs in (stock, evs, ottvid):
        assert kwargs["enable_prefix_caching"] is False and kwargs["mm_processor_cache_gb"] == 0
        assert kwargs["disable_log_stats"] is False  # RequestOutput.metrics is filled only then
    assert "video_pruning_rate" not in stock and "hf_overrides" not in stock
    assert evs["video_pruning_rate"] == 0.9 and "hf_overrides" not in evs
    assert ottvid["video_pruning_rate"] == 0.9 and ottvid["hf_overrides"] == {"ottvid_method": "ottvid"}


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "--rate must be in (0, 1)"),
    (["--rate", "1"], "--rate must be in (0, 1)"),
    (["--frames", "0"], "--frames must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--video", "/nonexistent/clip.mp4"], "no video file at /nonexistent/clip.mp4"),
])
def test_bad_options_are_refused_in_one_line_before_any_work(argv, message):
    run = subprocess.run([sys.executable, *SCRIPT, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert message in " ".join(run.stderr.split())


def test_the_script_imports_vllm_not_itself(tmp_path):
    # were benchmarks/ first on sys.path, `import vllm` would find this file ("cannot import name 'LLM' from
    # 'vllm'"); as `-m benchmarks.vllm` it is not, and the test environment has no vLLM, so a run's child
    # must report the real package missing
    (tmp_path / "plan.json").write_text("{}")
    run = subprocess.run([sys.executable, *SCRIPT, "--child", "stock", "--plan", str(tmp_path / "plan.json")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode != 0
    assert "No module named 'vllm'" in run.stderr, run.stderr[-2000:]


def test_rows_compare_vllm_runs_with_stock_vllm_and_the_pipeline_with_its_vanilla():
    rows = {row["run"]: row for row in bench.rows(_measurements())}
    assert list(rows) == ["vLLM, no pruning", "vLLM + EVS (its own)", "vLLM + OTT-Vid (plugin)",
                          "ottvid pipeline, vanilla", "ottvid pipeline + OTT-Vid"]
    assert rows["vLLM, no pruning"]["speedup"] == 1.0
    assert rows["vLLM + EVS (its own)"]["speedup"] == 2.5  # 20000 / 8000, by vLLM's TTFT
    assert rows["vLLM + OTT-Vid (plugin)"]["speedup"] == 4.0
    assert rows["ottvid pipeline + OTT-Vid"]["speedup"] == 2.5  # 30000 / 12000, against ottvid's vanilla
    assert rows["ottvid pipeline, vanilla"]["ttft_ms"] is None  # vLLM's metric: not invented for ottvid
    plugin = rows["vLLM + OTT-Vid (plugin)"]
    assert (plugin["prompt_tokens"], plugin["video_tokens"]) == (436, 403)


def test_table_from_saved_measurements(tmp_path, capsys):
    saved = tmp_path / "m.json"
    saved.write_text(json.dumps(_measurements()))
    bench.main(["--table", str(saved)])
    out = capsys.readouterr().out
    for text in ("vLLM + EVS (its own)", "q = 0.9", "keep 0.1", "4,065", "20,000", "2.50x", "4.00x", "cockatoo.mp4",
                 "588x336", "vLLM 0.32.0", "2 CPU threads"):
        assert text in out, text
    line = next(line for line in out.splitlines() if "ottvid pipeline, vanilla" in line)
    assert "30,000" in line and " - " in line  # no vLLM TTFT for ottvid's own pipeline


def test_a_file_that_is_not_saved_measurements_is_refused(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"rows": []}))
    run = subprocess.run([sys.executable, *SCRIPT, "--table", str(bad)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "holds no measurements of benchmarks/vllm.py --json" in " ".join(run.stderr.split())


def test_a_child_s_failure_is_told_by_its_last_error_line():
    output = ("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
              "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
              "  Value error, User-specified max_model_len (8192) is greater than the derived max_model_len\n"
              "    For further information visit https://errors.pydantic.dev\n")
    assert bench.last_error(output) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                        "ModelConfig Value error, User-specified max_model_len (8192) is greater "
                                        "than the derived max_model_len")
    assert bench.last_error("just a line\n") == "just a line"
    assert bench.last_error("") == "no output"


def test_threads_bind_names_the_cores_this_process_may_use():
    assert bench.threads_bind("0-3") == "0-3"
    cores = sorted(os.sched_getaffinity(0))
    expected = f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))
    assert bench.threads_bind(None) == expected


@pytest.mark.slow
def test_smoke_in_the_vllm_environment(vllm_env, tmp_path):
    """The whole script on the tiny model (head_dim 64) in vLLM's environment: every run's video tokens
    are the counts each asks for (V, vLLM's EVS count, round(0.1 V)); no time is asserted."""
    from benchmarks.envs.vllm_env import run_env

    run = subprocess.run([str(vllm_env.python), *SCRIPT, "--smoke", "--frames", "8", "--json"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT, env=run_env())
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout)
    tokens = {name: data["runs"][name]["runs"][0]["video_tokens"] for name in bench.RUNS}
    v = tokens["stock"]
    assert tokens["ottvid"] == round(0.1 * v)
    assert tokens["ottvid"] < tokens["evs"] < v  # EVS keeps the first frame's tokens whole
    for name in bench.RUNS:
        timed = data["runs"][name]["runs"][0]
        assert timed["ttft_ms"] > 0 and timed["engine_ms"] > 0 and timed["prompt_tokens"] > timed["video_tokens"]
    table = bench.render(data)
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    assert "vLLM + OTT-Vid (plugin)" in console.file.getvalue()
