"""Warm start: the warm-up is a real small question through the tiny model; `serve` reports ready only
after it ran; chat and ask run it too (docs/attention.md)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from ottvid_cli.backbones import load_backbone
from ottvid_cli.cli import app as cli_app
from ottvid_cli.serve.app import ServeSettings, create_app
from ottvid_cli.session import Engine
from tests.support.cli import runner
from ottvid_cli.video import sample_frames
from ottvid_cli.warmup import warm_clip, warm_up

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def backbone(tiny_qwen):
    return load_backbone(str(tiny_qwen), device="cpu")


def test_warm_up_runs_the_vision_encoder_and_the_llm(backbone):
    calls = {"vision": 0, "llm": 0}
    hooks = [backbone.model.model.visual.register_forward_hook(lambda *a: calls.__setitem__("vision", calls["vision"] + 1)),
             backbone.model.model.language_model.register_forward_hook(
                 lambda *a: calls.__setitem__("llm", calls["llm"] + 1))]
    try:
        ms = warm_up(backbone, max_new_tokens=2)
    finally:
        for hook in hooks:
            hook.remove()
    assert ms > 0 and backbone.warmup_ms == ms
    assert calls["vision"] == 1  # one encoding, shared by both questions
    assert calls["llm"] >= 3  # a full prefill, a prefill of the second question from the prefix, decoding steps


def test_warm_clip_has_the_default_requests_shape(backbone):
    """The default request's frame count (the first real request then finds its kernels made)."""
    clip = warm_clip(backbone)
    assert clip.frames.shape[0] == backbone.default_frames and clip.duration > 0
    assert clip.frames.shape[1] ** 2 <= backbone.max_pixels
    prepared = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "?")
    real = sample_frames(DATA / "cockatoo.mp4", backbone.default_frames)
    wanted = backbone.preprocess(real.frames, real.timestamps, real.duration, "?")
    assert prepared["video_grid_thw"][0, 0] == wanted["video_grid_thw"][0, 0]  # as many temporal groups
    assert warm_clip(backbone, groups=2).frames.shape[0] == 2 * backbone.frames_per_group


def test_warm_up_decodes_a_file(backbone, monkeypatch):
    """The decoder is warmed too: a small file sampled as a request's, resized for the model."""
    import ottvid_cli.video as video

    seen = []
    real = video.sample_frames

    def spy(path, *args, **kwargs):
        clip = real(path, *args, **kwargs)
        seen.append((path, kwargs.get("resize"), clip))
        return clip

    monkeypatch.setattr(video, "sample_frames", spy)
    warm_up(backbone, max_new_tokens=1)
    assert len(seen) == 1 and seen[0][1] is not None and len(seen[0][2].indices) == 4
    assert not Path(seen[0][0]).exists()  # the temporary file is gone


def test_engine_warm_up_leaves_the_caches_empty(backbone):
    engine = Engine(backbone)
    assert engine.warm_up() > 0
    assert len(engine.cache) == 0


class GatedEngine(Engine):
    """The real engine whose warm-up waits for `gate` first, so a test sees the server before it ends."""

    def __init__(self, backbone):
        super().__init__(backbone)
        self.gate = threading.Event()
        self.warmed = threading.Event()

    def warm_up(self) -> float:
        self.gate.wait(60)
        ms = super().warm_up()
        self.warmed.set()
        return ms


def test_health_is_503_until_the_warm_up_ran(backbone):
    from test_serve import ThreadServer, body

    engine = GatedEngine(backbone)
    server = ThreadServer(create_app(engine, ServeSettings(model_id="tiny", allowed_media_dir=str(DATA))))
    try:
        cold = httpx.get(server.url + "/health")
        assert cold.status_code == 503 and cold.json()["status"] == "warming up" and not cold.json()["ready"]
        results = {}
        request = threading.Thread(target=lambda: results.update(reply=httpx.post(
            server.url + "/v1/chat/completions", json=body(str(DATA / "bikes.mp4"), model="tiny"), timeout=120)))
        request.start()  # sent while warming up: it waits in the queue
        engine.gate.set()
        request.join(120)
        assert engine.warmed.is_set()
        warm = httpx.get(server.url + "/health")
        assert warm.status_code == 200 and warm.json()["ready"] and warm.json()["warmup_ms"] > 0
        assert results["reply"].status_code == 200
    finally:
        engine.gate.set()
        server.stop()


def test_ask_reports_the_warm_up_time_and_skips_it_on_the_cpu_unless_asked(tiny_qwen):
    import json

    command = ["ask", str(DATA / "bikes.mp4"), "What happens?", "--model", str(tiny_qwen), "--frames", "4",
               "--max-new-tokens", "2", "--device", "cpu", "--json"]
    result = runner.invoke(cli_app, [*command, "--warm-up"])
    assert result.exit_code == 0, result.output
    timings = json.loads(result.stdout)["timings_ms"]
    assert timings["warmup"] > 0 and timings["load"] > 0
    result = runner.invoke(cli_app, command)  # the default on the CPU: no warm-up (it only adds time there)
    assert result.exit_code == 0, result.output
    timings = json.loads(result.stdout)["timings_ms"]
    assert "warmup" not in timings and timings["load"] > 0


@pytest.mark.parametrize("flag", ["--warm-up", "--no-warm-up"])
def test_warm_up_flags_do_not_apply_with_a_server(flag):
    # refused before any request: nothing listens on the port, a request would give exit 1 "cannot reach"
    result = runner.invoke(cli_app, ["ask", str(DATA / "bikes.mp4"), "What happens?", "--server",
                                     "http://127.0.0.1:9", flag])
    assert result.exit_code == 2 and "--warm-up/--no-warm-up does not apply with --server" in result.output
