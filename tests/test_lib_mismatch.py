"""torch, torchvision and transformers that do not go together: one line naming the packages, their
versions and the install that fixes it, before the model loads (ottvid_cli/compat.py), instead of
transformers' `Could not import module 'AutoVideoProcessor'` reported as an internal error.

A real mismatched install (another torch or torchvision) takes minutes and gigabytes, so the mismatch
is staged: a folder put first on PYTHONPATH holds a fake `torchvision` package whose import raises
what a torchvision built for another torch raises (`operator torchvision::nms does not exist`), and a
fake `.dist-info` giving it (or transformers) another version. Python and importlib.metadata find
these before the environment's own; the test environment itself is not touched. The real command
line runs in a subprocess with the tiny model, which an unchecked run gets as far as loading.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ottvid_cli import compat

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
TORCH = importlib.metadata.version("torch")
SERIES = compat.torchvision_for(TORCH)  # the torchvision series built for the installed torch

pytestmark = pytest.mark.skipif(SERIES is None, reason="the torch/torchvision rule is for torch 2.x")


def _distribution(folder: Path, name: str, version: str) -> None:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _fake_torchvision(folder: Path, version: str) -> Path:
    """A torchvision `version` whose import fails as one built for another torch fails."""
    (folder / "torchvision").mkdir(parents=True)
    (folder / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    _distribution(folder, "torchvision", version)
    return folder


def _other_series() -> str:
    """A torchvision version of a series built for another torch (the one before this torch's)."""
    minor = int(SERIES.split(".")[1])
    return f"0.{minor - 1}.0"


def _run(args: list[str], overlay: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(overlay), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OTTVID_API_KEY": ""}
    return subprocess.run([sys.executable, "-m", "ottvid_cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, stdin=subprocess.DEVNULL, check=False)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "internal error" not in lines[0] and "AutoVideoProcessor" not in lines[0]
    return lines[0]


def test_a_torchvision_for_another_torch_is_one_line_before_anything_loads(tiny_qwen, tmp_path):
    vision = _other_series()
    overlay = _fake_torchvision(tmp_path / "overlay", vision)
    line = _one_line(_run(["ask", str(DATA / "bikes.mp4"), "What?", "--model", str(tiny_qwen), "--frames", "4"],
                          overlay))
    # said before the progress starts ("starting", "loading ..."): the versions alone, nothing imported
    assert f"torch {TORCH} and torchvision {vision} do not go together" in line
    assert f"pip install 'torchvision=={SERIES}.*'" in line and "reinstall torch and torchvision together" in line


def test_a_torchvision_that_cannot_load_beside_this_torch_is_one_line(tiny_qwen, tmp_path):
    """The same version numbers, another build: found by importing torchvision, before the weights load
    (`serve` refuses before it prints its address; `ask` before it reads the model's processor)."""
    overlay = _fake_torchvision(tmp_path / "overlay", f"{SERIES}.1")
    for args in (["serve", "--port", "0"], ["ask", str(DATA / "bikes.mp4"), "What?", "--frames", "4"]):
        args.append("--quiet")  # no progress lines: the error alone
        line = _one_line(_run([*args, "--model", str(tiny_qwen)], overlay))
        assert f"torchvision {SERIES}.1 cannot be loaded with torch {TORCH}" in line, line
        assert "(operator torchvision::nms does not exist)" in line
        assert f"pip install --force-reinstall 'torch=={TORCH.partition('+')[0]}' 'torchvision=={SERIES}.*'" in line


def test_a_transformers_older_than_the_minimum_is_one_line(tiny_qwen, tmp_path):
    overlay = tmp_path / "overlay"
    _distribution(overlay, "transformers", "5.10.0")
    line = _one_line(_run(["ask", str(DATA / "bikes.mp4"), "What?", "--model", str(tiny_qwen), "--frames", "4"],
                          overlay))
    assert line == (f"error: transformers 5.10.0 is older than ottvid needs ({compat.MIN_TRANSFORMERS} or newer): "
                    f"pip install -U 'transformers>={compat.MIN_TRANSFORMERS}'")


def test_the_minimum_transformers_is_pyprojects():
    assert f'"transformers>={compat.MIN_TRANSFORMERS}",' in (ROOT / "pyproject.toml").read_text()


def test_the_torchvision_of_a_torch_and_the_index_of_its_build():
    assert compat.torchvision_for("2.14.1") == "0.29" and compat.torchvision_for("2.13.0+cu128") == "0.28"
    assert compat.torchvision_for("3.0.0") is None and compat.torchvision_for("nightly") is None
    assert compat.version_mismatch() is None and compat.import_failure() is None  # this environment goes together
    compat.check_libraries()
