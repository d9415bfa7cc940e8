"""lmms-eval's own `vllm_generate` backend with ottvid's vLLM plugin (docs/eval.md, "lmms-eval
through vLLM"), end to end on the CPU: lmms-eval 0.7.3's CLI in an overlay over vLLM's CPU environment
(tests/support/vllm_lmms_env.py), the tiny local task of tests/data/lmms/ and a tiny Qwen3-VL. (Not Qwen2.5-VL: lmms-eval
0.7.3's vllm_generate hands vLLM a Qwen2.5-VL video without its metadata, which vLLM 0.32 refuses with "Video
metadata is required but not found in mm input", and lmms-eval then exits 0 without results.)

- the documented command (hf_overrides naming the method, video_pruning_rate) runs, scores and logs both
  questions; vLLM's log (at DEBUG) shows it started with the method and the rate, and that the model class it
  built is the plugin's (a bad method stopping vLLM's start-up with the plugin's line is
  tests/test_vllm_plugin.py's, through vLLM's server).
Skipped on purpose with OTTVID_SKIP_VLLM_ENV=1 or OTTVID_SKIP_LMMS_ENV=1.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.lmms_task import local_task
from tests.support.overlay_env import OverlayError

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("OTTVID_SKIP_LMMS_ENV") == "1",
                                 reason="OTTVID_SKIP_LMMS_ENV=1: the lmms-eval environments are not built")]


@pytest.fixture(scope="module")
def overlay(vllm_env):
    from tests.support.vllm_lmms_env import lmms_vllm_overlay

    try:
        return lmms_vllm_overlay(vllm_env)
    except (OverlayError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.fail(f"cannot build lmms-eval over the vLLM environment: {exc}", pytrace=False)


def _lmms_eval(overlay, model, task, out, cwd, method: str) -> subprocess.CompletedProcess:
    args = (f"model={model},video_pruning_rate=0.75,hf_overrides={{\"ottvid_method\": \"{method}\"}},nframes=4,"
            f"max_pixels=12544,gpu_memory_utilization=0.1,enforce_eager=True,max_model_len=4096,dtype=float32")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return subprocess.run([str(overlay.python), "-m", "lmms_eval", "--model", "vllm_generate", "--model_args", args,
                           "--tasks", "ottvid_tiny", "--include_path", str(task), "--limit", "2", "--batch_size", "2",
                           "--log_samples", "--output_path", str(out)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=900, check=False)


def test_lmms_eval_vllm_generate_with_the_plugin(overlay, tiny_qwen3_vllm, tmp_path):
    assert overlay.versions["lmms-eval"] == "0.7.3" and int(overlay.versions["av"].split(".")[0]) < 16
    task, _ = local_task(tmp_path)
    out = tmp_path / "out"
    done = _lmms_eval(overlay, tiny_qwen3_vllm, task, out, tmp_path, "ottvid")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    results = [json.loads(p.read_text()) for p in out.rglob("*_results.json")]
    assert results and results[0]["results"]["ottvid_tiny"]["accuracy,none"] in (0.0, 0.5, 1.0), log[-3000:]
    logged = [json.loads(line) for p in out.rglob("*samples_ottvid_tiny*.jsonl") for line in p.read_text().splitlines()]
    assert len(logged) == 2 and all(isinstance(r["filtered_resps"], str) for r in logged)
    assert "'video_pruning_rate': 0.75" in log and "'hf_overrides': {'ottvid_method': 'ottvid'}" in log, log[-3000:]
    assert "for class ottvid_cli.integrations.vllm.qwen3_vl.OTTVidQwen3VL" in log  # the plugin's model, built by vLLM
