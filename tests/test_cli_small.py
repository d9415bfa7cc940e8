"""Small behaviours of the command line and of `ottvid serve`: `ottvid` alone prints the help (stdout,
exit 0, nothing on stderr); chat names a preset only for the method it applies to; the server's whole
log (uvicorn's access lines included) goes to stderr; a reply's `timings_ms` hold only that request's
stages (the model's load and warm-up, once at start-up, are in /health). The server is a real
`ottvid serve` subprocess with the tiny Qwen2.5-VL on a free loopback port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ottvid_cli.chat import Chat

DATA = Path(__file__).parent / "data"


def _ottvid(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ottvid_cli", *args], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("args", [[], ["cache"], ["convert"]])
def test_a_group_alone_prints_its_help_on_stdout_and_exits_0(args):
    alone, helped = _ottvid(*args), _ottvid(*args, "--help")
    assert alone.returncode == 0 and alone.stderr == "", alone.stderr  # no stray empty line on stderr
    assert alone.stdout.startswith(f"Usage: {' '.join(['ottvid', *args])} COMMAND [options]")
    assert alone.stdout.rstrip("\n") == helped.stdout.rstrip("\n")  # the same help


class _Engine:
    backbone = None  # Compression.config reads the backbone's defaults: none here


def test_chat_names_the_preset_only_for_ottvid():
    chat = Chat(_Engine(), DATA / "bikes.mp4", ratio=0.25)
    assert ", preset paper, " in chat.settings()
    shown = chat.command("/method fastvid")
    assert "method fastvid" in shown and "preset" not in shown
    assert chat.command("/preset") == ("method fastvid has no preset (presets are OTT-Vid's: /method ottvid) "
                                       "(/preset VALUE changes it; /help)")
    assert ", preset paper, " in chat.command("/method ottvid")
    assert chat.command("/preset official").startswith("ratio 0.25, method ottvid, preset official, ")
    assert chat.command("/preset") == "preset official (/preset VALUE changes it; /help)"


class _Server:
    """`ottvid serve` with the tiny model in a subprocess, its stdout and stderr in files."""

    def __init__(self, model: Path, folder: Path):
        self.out, self.err = folder / "stdout", folder / "stderr"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OTTVID_API_KEY": ""}
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ottvid_cli", "serve", "--model", str(model), "--port", "0", "--device", "cpu",
                 "--allowed-media-dir", str(DATA)], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 180
        found = None
        while found is None:
            assert self.process.poll() is None and time.monotonic() < deadline, self.err.read_text()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", self.err.read_text())
            time.sleep(0.1)
        self.url = found.group(1)
        while True:  # 503 until the warm-up request has run
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert self.process.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.1)

    def ask(self, model: Path) -> dict:
        reply = httpx.post(self.url + "/v1/chat/completions", timeout=120, json={
            "model": str(model), "max_tokens": 2, "ottvid": {"frames": 4},
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": (DATA / "bikes.mp4").as_uri()}},
                {"type": "text", "text": "What happens?"}]}]})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@pytest.fixture(scope="module")
def server(tiny_qwen, tmp_path_factory):
    running = _Server(tiny_qwen, tmp_path_factory.mktemp("serve-output"))
    yield running
    running.stop()


def test_a_reply_times_only_its_request_and_health_gives_the_start_up(server, tiny_qwen):
    for _ in range(2):  # the first request and a cache hit
        timings = server.ask(tiny_qwen)["ottvid"]["timings_ms"]
        assert "load" not in timings and "warmup" not in timings, timings
        assert {"decode", "vision", "prefill", "generate"} <= set(timings)
    health = httpx.get(server.url + "/health").json()
    assert health["load_ms"] > 0 and health["warmup_ms"] > 0  # the start-up, said once
    info = httpx.get(server.url + "/v1/ottvid/info").json()
    assert info["load_ms"] == health["load_ms"] and info["warmup_ms"] == health["warmup_ms"]


def test_the_whole_server_log_goes_to_stderr(server, tiny_qwen):
    server.ask(tiny_qwen)
    httpx.get(server.url + "/health")
    assert server.stop() == 0
    log = server.err.read_text()
    assert server.out.read_text() == ""  # uvicorn writes its access lines to stdout unless told otherwise
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log and '"GET /health HTTP/1.1" 200' in log
    assert "ottvid serve: " in log and "Application startup complete" in log and "Shutting down" in log
    assert re.search(r"INFO: +warm-up: \d+ ms", log)  # ottvid's own lines, in the same format
