"""`ottvid serve` against work that never ends: loops a request can size, a fifo in the
cache folder, a worker that never comes back, connections that never send a request. Real server
processes (`ottvid serve` with the tiny Qwen2.5-VL, or the same uvicorn set-up around a stand-in
engine that never returns), real HTTP, SIGTERM."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_serve import DATA, ThreadServer, body

from ottvid_cli.serve.app import ServeSettings, create_app
from ottvid_cli.serve.connections import with_head_timeout

FOREVER = ["sinkhorn_stop=fixed", "max_iter=1000000000000"]  # ~23 us an iteration: years
GRACE = 10.0  # app.WORKER_GRACE


class ServeProcess:
    """`ottvid serve ARGS` (or `python -c CODE` printing the same first line) in a subprocess, on a free
    loopback port; `url` once it answers."""

    def __init__(self, log: Path, args: list[str] | None = None, code: str | None = None, model: str = ""):
        self.log, self.model = log, model
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OTTVID_API_KEY": ""}
        command = [sys.executable, "-m", "ottvid_cli", "serve", "--port", "0", "--device", "cpu", *(args or [])] \
            if code is None else [sys.executable, "-c", code]
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        deadline = time.monotonic() + 120
        found = None
        while found is None:
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", self.text())
            time.sleep(0.1)
        self.url = found.group(1)
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert self.process.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.1)

    def text(self) -> str:
        return self.log.read_text()

    def health(self) -> dict:
        return httpx.get(self.url + "/health").json()

    def post(self, request: dict, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", json=request, timeout=timeout)

    def wait_until_busy(self) -> None:
        deadline = time.monotonic() + 60
        while not self.health()["busy"]:
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.02)

    def wait_until_idle(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while self.health()["busy"]:
            assert time.monotonic() < deadline, f"the worker did not come back: {self.health()}\n{self.text()}"
            time.sleep(0.05)

    def terminate(self, within: float) -> int:
        """SIGTERM; the exit code, which must come within `within` seconds (the grace period, with room)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end the server within {within} s:\n{self.text()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def media(tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    for name in ("bikes", "realshort"):
        (folder / f"{name}.mp4").write_bytes((DATA / f"{name}.mp4").read_bytes())
    return folder


@pytest.fixture
def serve(tiny_qwen, media, tmp_path):
    started = []

    def run(*args: str) -> ServeProcess:
        server = ServeProcess(tmp_path / f"serve{len(started)}.log",
                              ["--model", str(tiny_qwen), "--allowed-media-dir", str(media), *args],
                              model=str(tiny_qwen))
        started.append(server)
        return server

    yield run
    for server in started:
        server.kill()


def ask(server: ServeProcess, media: Path, name: str = "bikes.mp4", text: str = "What happens?", **ottvid):
    return body(str(media / name), text, model=server.model, ottvid={"frames": 4, **ottvid})


# ------------------------------------------------------------------------------------------------
# 1: a loop a request sizes stops when its time is up


def test_a_sinkhorn_that_would_run_for_years_stops_at_the_timeout_and_the_next_request_is_served(serve, media):
    server = serve("--timeout", "4", "--max-sinkhorn-iter", "1000000000000")
    try:
        late = server.post(ask(server, media, method_args=FOREVER))
        assert late.status_code == 504 and late.json()["error"]["code"] == "timeout", late.text
        server.wait_until_idle()  # the worker is free again: the loop stopped at its next check
        reply = server.post(ask(server, media, "realshort.mp4"))
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None, reply.text
        # and SIGTERM while such a request runs ends the server within the grace period
        thread = threading.Thread(target=server.post, args=(ask(server, media, method_args=FOREVER),))
        thread.start()
        server.wait_until_busy()
        assert server.terminate(within=4 + GRACE + 30) == 0, server.text()
        thread.join(30)
    finally:
        server.kill()


def test_iterations_and_frames_are_bounded_by_server_options_named_in_the_error(serve, media):
    server = serve("--max-request-frames", "16", "--max-sinkhorn-iter", "500")
    try:
        for ottvid, param, said in [
            ({"method_args": ["max_iter=501"]}, "ottvid.method_args", "--max-sinkhorn-iter"),
            ({"frames": 1_000_000_000}, "ottvid.frames", "--max-request-frames"),
            ({"frames": None, "fps": 2.0, "max_frames": 17}, "ottvid.max_frames", "--max-request-frames"),
        ]:
            reply = server.post(ask(server, media, **ottvid))
            error = reply.json()["error"]
            assert reply.status_code == 400 and error["param"] == param and said in error["message"], reply.text
        assert server.health()["served"] == 0  # refused before any work
        ok = server.post(ask(server, media, "realshort.mp4", frames=None, fps=30.0, method_args=["max_iter=500"]))
        assert ok.status_code == 200, ok.text
        assert ok.json()["ottvid"]["frames"]["max_frames"] == 16  # fps sampling capped at the server's limit
    finally:
        server.kill()
    few = serve("--max-request-frames", "8")  # fewer than the model's default 32
    try:
        reply = few.post(ask(few, media, frames=None))
        assert reply.status_code == 200 and reply.json()["ottvid"]["frames"]["requested"] == 8, reply.text
    finally:
        server.kill()


def test_the_default_bounds():
    """Without the flags: 768 frames (what `--fps` sampling takes at most) and 10,000 iterations."""
    settings = ServeSettings(model_id="m")
    assert (settings.max_request_frames, settings.max_sinkhorn_iter) == (768, 10_000)


# ------------------------------------------------------------------------------------------------
# 2: a fifo in the cache folder


def test_a_fifo_in_the_cache_folder_is_a_damaged_entry_not_a_hung_worker(serve, media, tmp_path):
    cache = tmp_path / "cache"
    first = serve("--cache-dir", str(cache))
    reply = first.post(ask(first, media))
    assert reply.status_code == 200 and first.terminate(within=60) == 0, reply.text
    (data,) = cache.glob("*.safetensors")
    data.unlink()
    os.mkfifo(data)
    server = serve("--cache-dir", str(cache), "--timeout", "30")  # its memory cache is empty: the disk is read
    try:
        second = server.post(ask(server, media), timeout=60)
        assert second.status_code == 200 and second.json()["ottvid"]["cache_hit"] is False, second.text
        assert "damaged cache entry" in server.text() and "not a regular file" in server.text()
        assert server.terminate(within=30 + GRACE + 30) == 0
    finally:
        server.kill()


# ------------------------------------------------------------------------------------------------
# SIGTERM whatever the worker does

STUCK = textwrap.dedent("""
    import socket, sys, threading
    from ottvid_cli.cli.serve import serve_app
    from ottvid_cli.serve.app import ServeSettings, create_app

    class Stuck:  # a call that never returns and never looks at its cancel event
        def ask(self, *args, **kwargs):
            threading.Event().wait()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.set_inheritable(True)
    print(f"ottvid serve: stuck on http://127.0.0.1:{sock.getsockname()[1]}/v1", file=sys.stderr, flush=True)
    serve_app(create_app(Stuck(), ServeSettings(model_id="stuck", timeout=3)), sock, False, 3)
""")


def test_sigterm_ends_the_server_even_when_the_worker_never_comes_back(tmp_path):
    server = ServeProcess(tmp_path / "stuck.log", code=STUCK)
    try:
        media = tmp_path / "clip.mp4"
        media.write_bytes((DATA / "realshort.mp4").read_bytes())
        upload = "data:video/mp4;base64," + base64.b64encode(media.read_bytes()).decode()
        reply = server.post(body(upload, model="stuck"))
        assert reply.status_code == 504, reply.text
        assert server.health()["busy"] is True  # it never comes back: only the process's end frees it
        assert server.terminate(within=3 + GRACE + 30) == 0, server.text()
    finally:
        server.kill()
    assert "did not stop" in server.text()


# ------------------------------------------------------------------------------------------------
# 8: a connection that never sends a request


def test_a_connection_that_sends_no_request_or_stops_in_its_body_is_closed(tmp_path):
    class Idle:
        pass

    server = ThreadServer(create_app(Idle(), ServeSettings(model_id="idle")), http=with_head_timeout(0.5))
    try:
        host, port = server.url.removeprefix("http://").split(":")
        silent, dribbling, stalled = (socket.create_connection((host, int(port))) for _ in range(3))
        for sock in (silent, dribbling, stalled):
            sock.settimeout(30)
        dribbling.sendall(b"GET /health HTTP/1.1\r\n")
        for piece in (b"Ho", b"st: ", b"127"):  # a head that never ends
            time.sleep(0.2)
            dribbling.sendall(piece)
        stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"model\": ")  # and the rest never comes
        assert silent.recv(100) == b""  # closed by the server
        assert dribbling.recv(100) == b""
        assert stalled.recv(100) == b""
        assert httpx.get(server.url + "/health").status_code in (200, 503)  # others are served
    finally:
        server.stop()
