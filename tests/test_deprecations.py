"""No deprecation warnings from our calls into transformers: on the installed transformers
(5.24 here, which renamed `past_key_values=` to `cache=`) a tiny `ask` and `eval` run with every
FutureWarning / DeprecationWarning attributed to our code or to transformers turned into an error, and
`ask` / `ground --json` print nothing on stderr that speaks of a deprecation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ottvid_cli.backbones import base
from ottvid_cli.cli import app
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
WORDS = ("deprecated", "FutureWarning", "DeprecationWarning", "will be removed")


def _strict():
    """Warnings as errors: FutureWarning and DeprecationWarning raised at our call sites (a deprecated
    keyword is reported at its caller) or inside transformers."""
    context = warnings.catch_warnings()
    context.__enter__()
    for category in (FutureWarning, DeprecationWarning):
        for module in (r"ottvid_cli(\.|$)", r"transformers(\.|$)"):
            warnings.filterwarnings("error", category=category, module=module)
    return context


def test_the_cache_keyword_follows_the_installed_transformers(monkeypatch):
    import transformers

    for version, keyword in (("5.0.0", "past_key_values"), ("5.23.1", "past_key_values"), ("5.24.0", "cache"),
                             ("5.24.0.dev0", "cache"), ("5.30.2", "cache"), ("6.0.0", "cache")):
        monkeypatch.setattr(transformers, "__version__", version)
        assert base.with_cache("kv") == {keyword: "kv"}, version
    assert base.with_cache(None) == {}


def test_ask_and_eval_raise_no_deprecation_warning(tiny_qwen, tmp_path):
    # without --quiet, which ignores every warning
    context = _strict()
    try:
        result = runner.invoke(app, ["ask", str(DATA / "bikes.mp4"), "What happens?", "--model", str(tiny_qwen),
                                     "--frames", "4", "--max-new-tokens", "3", "--json"])
        assert result.exit_code == 0, result.output
        json.loads(result.stdout)
        # two questions: the second reuses the first's KV prefix (the cache handed to generate)
        result = runner.invoke(app, ["ask", str(DATA / "bikes.mp4"), "What happens?", "Who rides?", "--model",
                                     str(tiny_qwen), "--frames", "4", "--max-new-tokens", "3", "--json"])
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout)) == 2
        out = tmp_path / "run"
        result = runner.invoke(app, ["eval", "jsonl", "--data", str(EVAL / "custom.jsonl"), "--videos", str(DATA),
                                     "--model", str(tiny_qwen), "--method", "ottvid", "--ratio", "0.25",
                                     "--max-frames", "4", "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert [r["errors"] for r in summary["results"]] == [0], summary  # an error would be recorded, not raised
    finally:
        context.__exit__(None, None, None)


def _cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)  # the user's default: FutureWarnings shown once
    return subprocess.run([sys.executable, "-m", "ottvid_cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)


@pytest.mark.parametrize("quiet", [False, True], ids=["progress", "quiet"])
def test_ask_and_ground_json_print_nothing_deprecated(tiny_qwen, quiet):
    extra = ["--quiet"] if quiet else []
    ask = _cli("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--frames", "4",
               "--max-new-tokens", "3", "--json", *extra)
    assert ask.returncode == 0, ask.stderr
    json.loads(ask.stdout)
    ground = _cli("ground", DATA / "bikes.mp4", "riding", "--model", tiny_qwen, "--max-frames", "4",
                  "--max-new-tokens", "3", "--json", *extra)
    assert ground.returncode in (0, 3), ground.stderr  # 3: the random tiny model names no span
    for done in (ask, ground):
        for word in WORDS:
            assert word.lower() not in done.stderr.lower(), done.stderr
