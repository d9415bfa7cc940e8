"""`--model tiny:<arch>`: a tiny random checkpoint of the real architecture, built on first use into the user
cache (atomically), whose every answer says that it comes from a random model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ottvid_cli import tiny
from tests.support import cli

DATA = Path(__file__).parent / "data"


def invoke(*args):
    """`ottvid ARGS` in this process, with a short reply (the model's answers are noise anyway)."""
    return cli.invoke(*args, "--max-new-tokens", "8", env={"COLUMNS": "120"})


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh user cache ($XDG_CACHE_HOME) for this test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_ask_builds_the_tiny_model_once_and_says_it_is_random(cache, monkeypatch):
    result = invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", "tiny:qwen2.5-vl", "--frames", "4")
    assert result.exit_code == 0, result.output
    assert "random model: tiny:qwen2.5-vl has random weights" in " ".join(result.stdout.split())
    folder = cache / "ottvid" / "tiny" / f"qwen2.5-vl-v{tiny.VERSION}"
    assert json.loads((folder / "config.json").read_text())["ottvid_random_model"] is True
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temporary folder left behind
    inode = folder.stat().st_ino

    def no_second_build(*args, **kwargs):
        raise AssertionError("the tiny model was built again")

    monkeypatch.setattr(tiny, "build", no_second_build)
    again = invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", "tiny:qwen2.5-vl", "--frames", "4", "--json")
    assert again.exit_code == 0, again.output
    data = json.loads(again.stdout)
    assert data["random_model"] is True and data["model"] == "tiny:qwen2.5-vl" and data["answer"]
    assert folder.stat().st_ino == inode


@pytest.mark.parametrize("model", ["tiny:llava-onevision", "tiny:qwen3-vl"])
def test_other_architectures_answer(cache, model):
    data = json.loads(invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", model, "--frames", "4",
                             "--json").stdout)
    assert data["random_model"] is True and data["model"] == model
    assert data["tokens"]["generated"] > 0 and data["frames"]["count"] == 4


def test_a_tiny_folder_passed_by_its_path_is_a_random_model_and_a_test_checkpoint_is_not(cache, tiny_qwen):
    folder = tiny.ensure("tiny:qwen2.5-vl")
    marked = json.loads(invoke("ask", DATA / "yoga.mp4", "q", "--model", folder, "--frames", "4", "--json").stdout)
    plain = json.loads(invoke("ask", DATA / "yoga.mp4", "q", "--model", tiny_qwen, "--frames", "4", "--json").stdout)
    assert marked["random_model"] is True and plain["random_model"] is False


def test_an_unknown_tiny_model_is_a_one_line_error(cache):
    result = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", str(DATA / "yoga.mp4"), "q", "--model",
                             "tiny:nope"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tiny:nope" in lines[0], result.stderr
    assert all(name in lines[0] for name in ("tiny:qwen2.5-vl", "tiny:qwen3-vl", "tiny:qwen3-vl-moe",
                                             "tiny:llava-onevision"))
    assert not (cache / "ottvid").exists()


def test_a_concurrent_build_that_finishes_first_is_kept(cache, monkeypatch):
    """Two builders at once: the one that renames second finds the folder there, keeps it and removes its own."""
    target = tiny.folder("tiny:qwen3-vl")
    real = tiny.build

    def racing(model, path):
        real(model, path)
        other = target.parent / ".other-builder"
        real(model, other)
        os.rename(other, target)  # the other builder wins the race
        (target / "winner").write_text("")

    monkeypatch.setattr(tiny, "build", racing)
    assert tiny.ensure("tiny:qwen3-vl") == target
    assert (target / "winner").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
    assert tiny.is_random_model(target)


def test_frame_plan_waits_for_the_build_then_reads_the_tiny_checkpoint(cache):
    from ottvid_cli.backbones import frame_plan

    assert frame_plan("tiny:qwen2.5-vl") is None  # not built: the load builds it (under its progress line)
    assert not tiny.built("tiny:qwen2.5-vl")
    tiny.ensure("tiny:qwen2.5-vl")
    frames, resize = frame_plan("tiny:qwen2.5-vl")
    assert frames == 32 and resize(None, None) is not None


def test_the_tiny_model_is_the_tests_checkpoint_with_the_mark(cache, tiny_qwen):
    """Built by the builder the tests use (same seed, same config): the weights are byte for byte the same."""
    folder = tiny.ensure("tiny:qwen2.5-vl")
    assert (folder / "model.safetensors").read_bytes() == (tiny_qwen / "model.safetensors").read_bytes()
    ours = json.loads((folder / "config.json").read_text())
    assert ours.pop("ottvid_random_model") is True
    assert ours == json.loads((tiny_qwen / "config.json").read_text())


@pytest.mark.slow
def test_the_quick_start_command_runs_as_written(cache):
    """The README's quick start, through the console script: the default sampling, the text report."""
    command = [sys.executable, "-m", "ottvid_cli", "ask", "tests/data/cockatoo.mp4", "What happens?", "--model",
               "tiny:qwen2.5-vl"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=DATA.parent.parent,
                            env={**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "random model: tiny:qwen2.5-vl" in result.stdout
