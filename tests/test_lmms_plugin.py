"""The lmms-eval plugin (`--model ottvid`), run by lmms-eval's own CLI on the tiny Qwen2.5-VL and a
two-question local task (tests/data/lmms/). Skipped where lmms-eval is not installed: it is the
optional `lmms` extra, not part of `test` (it pins av<16; see docs/eval.md)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lmms_eval") is None,
                                reason="lmms-eval is not installed (pip install -e '.[lmms]')")


def test_generation_only_methods_say_so():
    from ottvid_cli.lmms import OTTVidLMM, manifest

    assert manifest().model_id == "ottvid" and manifest().simple_class_path == "ottvid_cli.lmms.OTTVidLMM"
    model = OTTVidLMM.__new__(OTTVidLMM)
    for name in ("loglikelihood", "generate_until_multi_round"):
        with pytest.raises(NotImplementedError, match="only generates"):
            getattr(model, name)([])


def test_lmms_eval_cli_runs_a_local_video_task_through_ottvid(tiny_qwen, tmp_path):
    task = tmp_path / "task"
    shutil.copytree(DATA / "lmms", task)
    docs = json.loads((task / "ottvid_tiny.json").read_text())
    for doc in docs:
        doc["video"] = str(DATA / doc["video"])
    (task / "ottvid_tiny.json").write_text(json.dumps(docs))
    yaml = task / "ottvid_tiny.yaml"
    yaml.write_text(yaml.read_text().replace("DATA_FILE", str(task / "ottvid_tiny.json")))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "lmms_eval", "--model", "ottvid",
               "--model_args", f"pretrained={tiny_qwen},method=ottvid,ratio=0.25,frames=4",
               "--tasks", "ottvid_tiny", "--include_path", str(task), "--limit", "2", "--batch_size", "1",
               "--log_samples", "--output_path", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # run outside the repository: a folder named like a plugin package would shadow its import
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = [json.loads(p.read_text()) for p in out.rglob("*_results.json")]
    assert results and results[0]["results"]["ottvid_tiny"]["accuracy,none"] in (0.0, 0.5, 1.0)
    logged = [line for p in out.rglob("*samples_ottvid_tiny*.jsonl") for line in p.read_text().splitlines()]
    assert len(logged) == 2
    replies = [json.loads(line) for line in logged]
    assert all(isinstance(r["filtered_resps"], str) for r in replies)
    assert {r["input"].splitlines()[0] for r in replies} == {"Where is the person?", "What do the people ride?"}
