"""`ottvid ask / ground --server URL` against vLLM's own OpenAI server.

One real `vllm serve` (vLLM's CPU build, in the cached environment of benchmarks/envs/vllm_env.py) with ottvid's
plugin on (`--video-pruning-rate 0.9 --hf-overrides '{"ottvid_method": "ottvid"}'`: conftest's
`vllm_server`, shared with tests/test_vllm_plugin.py; a start takes ~30 s) serves a tiny Qwen2.5-VL; the
command line runs as real subprocesses of this environment. The tiny model's output layer is set so that
its greedy reply is made of the letters A and B only (its first token is A or B whatever the video): a
reply a multiple-choice question can be read from, and a grounding reply without a time.

The module's first tests need no server: what a plain server's reply becomes (`openai_compat`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ottvid_cli.remote.openai_compat import PlainServer, is_ottvid_serve, media_io_kwargs, not_per_request
from ottvid_cli.tasks import grounding, qa

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
CHOICES = ["a dog", "a bike"]


def ottvid(*args: str) -> subprocess.CompletedProcess:
    """The command line as a user runs it (this checkout first on the path)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    environ.pop("OTTVID_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "ottvid_cli", *args], capture_output=True, text=True,
                          env=environ, timeout=600, check=False)


# ------------------------------------------------------------------------------------------------
# what a plain server's reply becomes (no server)


def _reply(text: str, prompt_tokens: int = 50, completion_tokens: int = 4) -> dict:
    """A chat completion as vLLM writes it (its fields we read)."""
    return {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}, "metrics": None}


def test_the_kind_of_server_is_read_from_the_model_card():
    assert is_ottvid_serve({"id": "x", "owned_by": "ottvid"})
    assert not is_ottvid_serve({"id": "x", "owned_by": "vllm"}) and not is_ottvid_serve({"id": "x"})


def test_a_plain_servers_span_is_read_and_clipped_as_a_local_run_does():
    server = PlainServer("ground", "vllm", video="v.mp4", duration=8.0)
    data = server.result(_reply("From 2.5 to 12 seconds."), "the bike passes", "http://h")
    assert data["span"] == [2.5, 8.0] and data["span_note"] is None  # clipped to the file's 8 s
    assert data["prompt"] == grounding.build_prompt("the bike passes")
    point = PlainServer("ground", "vllm", point=True, duration=None).result(_reply("at 30 s"), "q", "http://h")
    assert point["span"] == [30.0, 30.0] and point["prompt"] == grounding.build_prompt("q", point=True)
    none = server.result(_reply("at 3 s"), "q", "http://h")
    assert none["span"] is None and none["span_note"] == grounding.span_note("at 3 s")


def test_the_duration_a_span_is_clipped_to_is_the_files():
    from ottvid_cli.video import sample_frames, video_duration

    assert video_duration(DATA / "bikes.mp4") == pytest.approx(10.0)
    assert video_duration(DATA / "fire2.mp4") == pytest.approx(sample_frames(DATA / "fire2.mp4", 4).duration)


def test_a_plain_servers_unknowns_are_none_and_its_counts_kept():
    data = PlainServer("ask", "vllm", choices=CHOICES).result(_reply("The answer is B.", 77, 5), "What?", "http://h")
    assert data["letter"] == "B" and data["prompt"] == qa.build_prompt("What?", CHOICES)
    assert data["tokens"]["llm_input"] == 77 and data["tokens"]["generated"] == 5
    assert all(v is None for k, v in data["tokens"].items() if k not in ("llm_input", "generated"))
    assert all(data[k] is None for k in ("device", "dtype", "method", "ratio", "frames", "compression", "cache_hit"))
    assert set(data["timings_ms"]) >= {"load", "vision", "compression", "prefill"}
    assert all(v is None for v in data["timings_ms"].values())


def test_the_rate_goes_as_vllms_media_io_kwargs_and_the_method_is_refused():
    assert media_io_kwargs(None, None) is None
    assert media_io_kwargs(1.0, 768) == {"video": {"fps": 1.0, "max_frames": 768, "num_frames": 768}}
    assert not_per_request(["--server", "--json", "--fps"], "vllm") is None
    assert "--video-pruning-rate" in not_per_request(["--server", "--ratio"], "vllm")
    assert "give --fps" in not_per_request(["--frames"], "vllm")


def test_a_web_server_that_is_no_openai_server_is_one_line(tmp_path):
    """A real HTTP server whose /v1/models is a web page, not a model list: one line, exit 1."""
    import functools
    import http.server
    import threading

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("<html>hello</html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        done = ottvid("ask", str(DATA / "bikes.mp4"), "What?", "--server", url, "--quiet")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == 1 and done.stderr.strip() == (f"error: {url}/v1/models lists no model: is this an "
                                                            f"OpenAI-compatible server?"), done.stderr


# ------------------------------------------------------------------------------------------------
# a real vLLM server


@pytest.mark.slow
def test_ask_answers_from_vllm_and_says_what_it_does_not_know(vllm_server):
    video = str(vllm_server.media / "bikes.mp4")
    done = ottvid("ask", video, "What happens?", "--server", vllm_server.base, "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr
    assert "answer: " in done.stdout and set(done.stdout.split("answer: ")[1].split()[0]) <= {"A", "B"}
    assert f"run at {vllm_server.base} (vllm, not ottvid serve)" in done.stdout
    for line in ("frames         unknown", "visual tokens  unknown", "method, ratio  unknown"):
        assert line in done.stdout, done.stdout
    assert "into the LLM" in done.stdout and "the server's metrics: time_to_first_token" in done.stdout


@pytest.mark.slow
def test_ask_json_has_null_for_what_vllm_does_not_return(vllm_server):
    video = str(vllm_server.media / "bikes.mp4")
    done = ottvid("ask", video, "What happens?", "--server", vllm_server.base, "--max-new-tokens", "3", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["task"] == "ask" and run["video"] == video and run["prompt"] == qa.build_prompt("What happens?")
    assert run["answer"] and set(run["answer"]) <= {"A", "B"} and run["tokens"]["generated"] == 3
    assert run["server"] == {"url": vllm_server.base, "owned_by": "vllm"}
    for key in ("device", "dtype", "method", "ratio", "frames", "compression", "cache_hit", "letter"):
        assert run[key] is None, key
    assert all(value is None for value in run["timings_ms"].values())
    tokens = run["tokens"]
    assert isinstance(tokens["llm_input"], int) and tokens["llm_input"] > 0
    assert all(tokens[k] is None for k in ("visual_before", "visual_after", "merges", "prunes", "grid", "text"))
    assert run["server_metrics"]["time_to_first_token_ms"] > 0  # vLLM's own, with --enable-per-request-metrics


@pytest.mark.slow
def test_the_letter_of_a_multiple_choice_reply_is_read_here(vllm_server):
    video = str(vllm_server.media / "bikes.mp4")
    args = ["ask", video, "What is in the video?", "-c", CHOICES[0], "-c", CHOICES[1], "--server", vllm_server.base,
            "--max-new-tokens", "1"]
    done = ottvid(*args, "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["prompt"] == qa.build_prompt("What is in the video?", CHOICES)
    assert run["answer"] in ("A", "B") and run["letter"] == run["answer"]
    shown = ottvid(*args)
    assert shown.returncode == 0 and f"choice: {run['letter']}" in shown.stdout, shown.stdout


@pytest.mark.slow
def test_the_rate_and_its_cap_reach_vllm_per_request(vllm_server):
    """--fps and --max-frames go as media_io_kwargs: 4 fps over the 10 s clip is 40 frames, capped at 10
    it is the 10 frames of 1 fps (the same video tokens), and more than vLLM's default 2 fps."""
    video = str(vllm_server.media / "bikes.mp4")
    counts = {}
    for args in (("--fps", "1"), ("--fps", "4", "--max-frames", "10"), ("--fps", "4"), ()):
        done = ottvid("ask", video, "What?", "--server", vllm_server.base, "--max-new-tokens", "1", "--json", *args)
        assert done.returncode == 0, done.stderr
        counts[args] = json.loads(done.stdout)["tokens"]["llm_input"]
    assert counts[("--fps", "1")] == counts[("--fps", "4", "--max-frames", "10")] < counts[()] < counts[("--fps", "4")]


@pytest.mark.slow
def test_ground_without_a_time_in_the_reply_exits_3(vllm_server, tmp_path):
    outside = tmp_path / "clip.mp4"  # outside --allowed-local-media-path: sent as an upload
    shutil.copy(DATA / "bikes.mp4", outside)
    done = ottvid("ground", str(outside), "someone rides a bike", "--server", vllm_server.base, "--json",
                  "--max-new-tokens", "4")
    assert done.returncode == 3, done.stderr
    run = json.loads(done.stdout)
    assert run["task"] == "ground" and run["span"] is None and run["span_note"] == "the reply holds no time"
    assert run["prompt"] == grounding.build_prompt("someone rides a bike") and run["frames"] is None
    assert "error: no time span in the model's reply (the reply holds no time)" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, flag", [
    (["--method", "topk"], "--method"),
    (["--method", "ottvid"], "--method"),  # the default's name, given: vLLM's may be another
    (["-r", "0.5"], "--ratio"),
    (["--method-arg", "gamma=0.3"], "--method-arg"),
    (["--preset", "official"], "--preset"),
    (["--frames", "8"], "--frames"),
])
def test_options_only_ottvid_serve_takes_are_refused(vllm_server, args, flag):
    before = vllm_server.requests()
    done = ottvid("ask", str(vllm_server.media / "bikes.mp4"), "What?", "--server", vllm_server.base, "--quiet", *args)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} does not apply to this server (vllm, not ottvid "
                                                   f"serve): "), done.stderr
    assert vllm_server.requests() == before  # refused before any question was sent


@pytest.mark.slow
def test_bad_options_are_refused_here_before_any_question(vllm_server):
    """The prompt is built here for a plain server, so its checks run here (`ottvid serve` runs them there)."""
    before = vllm_server.requests()
    done = ottvid("ask", str(vllm_server.media / "bikes.mp4"), "What?", "-c", "a dog", "-c", " ", "--server",
                  vllm_server.base, "--quiet")
    assert done.returncode == 2 and done.stderr.strip() == "error: option 2 is empty", done.stderr
    assert vllm_server.requests() == before
