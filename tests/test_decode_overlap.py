"""Decode while the model loads: a one-shot ask / ground decodes the video in a background
thread during the load, reports the whole question's wall time, and a video that fails to decode stops
the load with the same one-line error."""

from __future__ import annotations

import json
import pathlib
import signal
import threading

import numpy as np

from ottvid_cli.cli.app import app
from tests.support.cli import runner

DATA = pathlib.Path(__file__).parent / "data"


def _slow_load(monkeypatch, seen: dict, wait_for_decode: bool):
    """load_backbone that, before loading, waits (up to 60 s) for a decoding thread to finish, recording
    whether one ran meanwhile: a load that overlaps nothing finds none."""
    import ottvid_cli.backbones as backbones
    from ottvid_cli.cli import early

    real = backbones.load_backbone
    started: list = []
    original_start = early.start

    def start(*args, **kwargs):
        handle = original_start(*args, **kwargs)
        started.append(handle)
        return handle

    def load(*args, **kwargs):
        seen["decoding"] = bool(started) and started[0] is not None
        if wait_for_decode and seen["decoding"]:
            seen["finished_during_load"] = started[0].done.wait(60)
        elif not wait_for_decode:
            for _ in range(600):  # "loading" for up to 60 s unless interrupted
                threading.Event().wait(0.1)
            seen["load_finished"] = True
        return real(*args, **kwargs)

    monkeypatch.setattr(early, "start", start)
    monkeypatch.setattr(backbones, "load_backbone", load)


def test_ask_decodes_while_the_model_loads(tiny_qwen, monkeypatch):
    seen: dict = {}
    _slow_load(monkeypatch, seen, wait_for_decode=True)
    result = runner.invoke(app, ["ask", str(DATA / "cockatoo.mp4"), "What happens?", "--model", str(tiny_qwen),
                                 "--json", "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert seen == {"decoding": True, "finished_during_load": True}  # the video was decoded during the load
    assert data["decoded_while_loading"] is True
    timings = data["timings_ms"]
    assert timings["decode"] > 0 and timings["wall"] > 0
    assert data["frames"]["count"] == 32 and data["video"] == str(DATA / "cockatoo.mp4")


def test_the_report_says_decoding_overlapped_loading(tiny_qwen):
    result = runner.invoke(app, ["ground", str(DATA / "bikes.mp4"), "the bikes", "--model", str(tiny_qwen),
                                 "--max-new-tokens", "2"])
    assert result.exit_code in (0, 3), result.output
    said = " ".join(result.stdout.split())
    assert "wall" in said and "from the command's start to the last token" in said
    assert "beside the loading, so wall is that much below the stages' sum" in said


def test_a_cache_folder_decodes_after_loading(tiny_qwen, tmp_path, monkeypatch):
    """With --cache-dir the entry may spare the decoding: nothing is decoded before the model is there."""
    seen: dict = {}
    _slow_load(monkeypatch, seen, wait_for_decode=True)
    result = runner.invoke(app, ["ask", str(DATA / "realshort.mp4"), "What?", "--model", str(tiny_qwen), "--json",
                                 "--max-new-tokens", "2", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert seen == {"decoding": False} and json.loads(result.stdout)["decoded_while_loading"] is False


def test_a_decoding_failure_stops_the_load_with_its_one_line_error(tiny_qwen, tmp_path, monkeypatch):
    """A folder whose first image reads (the early check passes) but whose later images differ in size:
    the decoder's error ends the run at once, the (here endless) load abandoned."""
    from PIL import Image

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(12):
        size = (64, 48) if i < 6 else (32, 32)
        Image.fromarray(np.full((size[1], size[0], 3), i * 20, np.uint8)).save(folder / f"f{i:02d}.png")
    seen: dict = {}
    _slow_load(monkeypatch, seen, wait_for_decode=False)
    # the interrupt is Python's SIGINT handler's: installed even where the test run was started with SIGINT
    # ignored (a background job of a non-interactive shell), where interrupting the main thread does nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = runner.invoke(app, ["ask", str(folder), "What?", "--model", str(tiny_qwen), "--frames", "12"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 2, result.output
    assert "frame images differ in size" in result.stderr and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == \
        [result.stderr.strip().splitlines()[-1]]
    assert "load_finished" not in seen


def test_profile_decodes_while_the_model_loads(tiny_qwen, monkeypatch):
    seen: dict = {}
    _slow_load(monkeypatch, seen, wait_for_decode=True)
    result = runner.invoke(app, ["profile", str(DATA / "yoga.mp4"), "--model", str(tiny_qwen), "--frames", "8",
                                 "--repeats", "1", "--warmup", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert seen == {"decoding": True, "finished_during_load": True}
    data = json.loads(result.stdout)
    assert data["frames"]["count"] == 8 and data["rows"][0]["timings_ms"]["decode"]["median"] > 0
