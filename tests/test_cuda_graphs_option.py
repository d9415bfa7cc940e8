"""--cuda-graphs/--no-cuda-graphs and the config file's `cuda_graphs`: read, checked, and handed to the engine."""

from __future__ import annotations

import json
import pathlib

import pytest

from ottvid_cli.checks import SettingsError
from ottvid_cli.cli.request import parse, settled
from ottvid_cli.defaults import load_defaults
from tests.support.cli import invoke

VIDEO = pathlib.Path(__file__).parent / "data" / "cockatoo.mp4"


def _config(tmp_path: pathlib.Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"OTTVID_CONFIG": str(path)}


def test_the_config_key_takes_a_boolean_only(tmp_path):
    assert load_defaults(_config(tmp_path, "cuda_graphs = false\n")).cuda_graphs is False
    assert load_defaults(_config(tmp_path, "")).cuda_graphs is None  # unset: on with CUDA only
    with pytest.raises(SettingsError, match="cuda_graphs must be true or false, got 'no'"):
        load_defaults(_config(tmp_path, 'cuda_graphs = "no"\n'))


def test_the_flag_wins_over_the_config_file(tmp_path, monkeypatch):
    for key, value in _config(tmp_path, "cuda_graphs = false\n").items():
        monkeypatch.setenv(key, value)
    assert settled(parse("ask", str(VIDEO), ["q"], {})).model.cuda_graphs is False
    assert settled(parse("ask", str(VIDEO), ["q"], {"cuda_graphs": True})).model.cuda_graphs is True


def test_a_bad_config_value_is_one_line_before_any_work(tmp_path):
    result = invoke("ask", VIDEO, "q", "--model", "tiny:qwen2.5-vl", env=_config(tmp_path, "cuda_graphs = 1\n"))
    assert result.exit_code == 2
    assert "cuda_graphs must be true or false, got 1" in result.output and "Traceback" not in result.output


def test_with_a_server_the_flag_is_refused():
    result = invoke("ask", VIDEO, "q", "--server", "http://127.0.0.1:9", "--no-cuda-graphs")
    assert result.exit_code != 0
    assert "--cuda-graphs/--no-cuda-graphs does not apply with --server" in result.output


def test_the_padded_prefill_on_the_cpu_answers_as_the_plain_one(tiny_qwen):
    """--cuda-graphs on the CPU runs the bucketed, padded prefill eagerly (what a graph replays on CUDA):
    the same reply, token for token, as generate()'s own prefill."""
    runs = []
    for flag in ("--cuda-graphs", "--no-cuda-graphs"):
        result = invoke("ask", VIDEO, "What happens?", "--model", tiny_qwen, "--frames", "4", "--json", "--quiet",
                        "--max-new-tokens", "6", flag)
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    padded, plain = runs
    assert padded["answer"] == plain["answer"]
    assert plain["prefill_graph"] is None  # --no-cuda-graphs: generate()'s own prefill
    graph = padded["prefill_graph"]
    assert graph["path"] == "padded" and graph["tokens"] == padded["tokens"]["llm_input"]
    assert graph["tokens"] <= graph["bucket"] and graph["bucket"] % 16 == 0
