"""`ottvid ask` and `ottvid ground` driven through the real CLI on a tiny Qwen2.5-VL and real clips."""

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import pytest
import torch

from tests.support.cli import invoke

DATA = Path(__file__).parent / "data"
JSON_KEYS = {"answer", "letter", "span", "frames", "tokens", "compression", "timings_ms", "model", "ratio", "method"}
# no "warmup": ask warms up on accelerators, or with --warm-up (test_ask_human_output)
# wall: from the command's start (startup) to the last token; other: the time in no stage
TIMING_KEYS = {"startup", "load", "other", "decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate", "wall"}


def as_json(result, codes=(0,)):
    assert result.exit_code in codes, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("clip", ["bikes", "cockatoo", "fire2", "realshort", "yoga"])
def test_ask_json_on_every_clip(tiny_qwen, clip):
    data = as_json(invoke("ask", DATA / f"{clip}.mp4", "What happens?", "--model", tiny_qwen, "--json",
                          "--max-new-tokens", "6", "--frames", "8"))
    assert JSON_KEYS <= set(data)
    assert isinstance(data["answer"], str) and data["letter"] is None and data["span"] is None
    assert data["method"] == "ottvid" and data["ratio"] == 0.1 and data["model"] == str(tiny_qwen)
    assert data["frames"]["count"] == len(data["frames"]["timestamps"]) == 8
    tokens = data["tokens"]
    assert tokens["visual_after"] == max(1, round(0.1 * tokens["visual_before"]))
    assert tokens["llm_input"] == tokens["text"] + tokens["visual_after"]
    assert set(data["timings_ms"]) == TIMING_KEYS and all(v >= 0 for v in data["timings_ms"].values())
    assert data["compression"]["M"] == tokens["visual_after"] and data["compression"]["T"] == 4


def test_ask_with_options_reports_a_letter_field(tiny_qwen):
    data = as_json(invoke("ask", DATA / "bikes.mp4", "Who rides?", "--options", "A. cyclists",
                          "--options", "B. nobody", "--model", tiny_qwen, "--json", "--frames", "8"))
    assert data["letter"] in ("A", "B", None)
    assert data["prompt"].endswith("Answer with the option's letter from the given choices directly.")
    assert "A. cyclists\nB. nobody" in data["prompt"]


def test_ask_human_output(tiny_qwen):
    result = invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", tiny_qwen, "--frames", "8",
                    "--ratio", "0.25", "--max-new-tokens", "4", "--warm-up")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("answer", "spatial selection", "temporal merge / prune", "into the LLM", "prefill", "decode",
                 "warm-up before the first question"):
        assert text in out
    assert out.index("answer") < out.index("visual tokens")  # the answer comes first


def test_method_none(tiny_qwen):
    data = as_json(invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", tiny_qwen, "--json",
                          "--method", "none", "--frames", "8", "--max-new-tokens", "4"))
    assert data["compression"] is None and data["timings_ms"]["compression"] is None
    assert data["timings_ms"]["saliency"] is None  # the stock model needs no saliency
    assert data["tokens"]["visual_after"] == data["tokens"]["visual_before"]
    assert all(data["timings_ms"][k] is not None for k in TIMING_KEYS - {"compression", "saliency"})


def test_ratio_one_answer_equals_the_stock_model(tiny_qwen):
    data = as_json(invoke("ask", DATA / "bikes.mp4", "Describe it.", "--model", tiny_qwen, "--json",
                          "--ratio", "1.0", "--frames", "8", "--max-new-tokens", "16"))
    stock = as_json(invoke("ask", DATA / "bikes.mp4", "Describe it.", "--model", tiny_qwen, "--json",
                           "--method", "none", "--frames", "8", "--max-new-tokens", "16"))
    assert data["answer"] == stock["answer"]
    assert data["tokens"]["visual_after"] == data["tokens"]["visual_before"]


def test_ground_json_and_human(tiny_qwen):
    data = as_json(invoke("ground", DATA / "bikes.mp4", "a bike passes", "--model", tiny_qwen, "--json",
                          "--max-new-tokens", "8"), codes=(0, 3))
    assert JSON_KEYS <= set(data)
    assert data["frames"]["count"] == 20  # 2 fps over 10 s
    assert data["span"] is None or (0 <= data["span"][0] <= data["span"][1] <= data["frames"]["duration"])
    assert "start and end time in seconds" in data["prompt"]
    capped = as_json(invoke("ground", DATA / "bikes.mp4", "a bike passes", "--model", tiny_qwen, "--json",
                            "--max-frames", "8", "--max-new-tokens", "2"), codes=(0, 3))
    assert capped["frames"]["count"] == 8
    human = invoke("ground", DATA / "fire2.mp4", "fire", "--model", tiny_qwen, "--max-new-tokens", "4")
    assert human.exit_code in (0, 3) and "when" in human.stdout  # 3: the random model's reply holds no time


def test_ground_span_comes_from_the_reply(tiny_qwen, monkeypatch):
    """The span is parsed from whatever the model said (here a fixed reply), clipped to the video."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    real = Qwen25VL.generate

    def reply(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out.text = "The event happens in the 3.5 - 42 seconds."
        return out

    monkeypatch.setattr(Qwen25VL, "generate", reply)
    data = as_json(invoke("ground", DATA / "bikes.mp4", "a bike passes", "--model", tiny_qwen, "--json",
                          "--max-new-tokens", "1"))
    assert data["span"] == [3.5, pytest.approx(10.0)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["ask", DATA / "missing.mp4", "q"], "video not found"),
        (["ask", DATA / "README.md", "q"], "cannot read video"),
        (["ask", DATA / "bikes.mp4", "q", "--ratio", "0"], "--ratio must be in (0, 1]"),
        (["ask", DATA / "bikes.mp4", "q", "--ratio", "1.5"], "--ratio must be in (0, 1]"),
        (["ask", DATA / "bikes.mp4", "   "], "the question is empty"),
        (["ground", DATA / "bikes.mp4", ""], "the query is empty"),
        (["ask", DATA / "bikes.mp4", "q", "--method", "fast"], "--method must be one of"),
        (["ground", DATA / "bikes.mp4", "q", "--fps", "0"], "--fps must be > 0"),
    ],
)
def test_bad_input_is_a_one_line_error(tiny_qwen, args, message):
    result = invoke(*args, "--model", tiny_qwen)
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_video_without_frames(tiny_qwen, tmp_path):
    path = tmp_path / "zero.mp4"
    container = av.open(str(path), "w", format="mp4")
    stream = container.add_stream("mpeg4", rate=25)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    container.start_encoding()  # write the header of a stream that will get no frames
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    result = invoke("ask", path, "q", "--model", tiny_qwen)
    assert result.exit_code == 2 and "no frames" in result.stderr


def test_unknown_model_offline_says_how_to_get_weights(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", str(DATA / "bikes.mp4"), "q", "--model",
                           "Qwen/Qwen2.5-VL-7B-Instruct"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "hf download Qwen/Qwen2.5-VL-7B-Instruct" in proc.stderr and "--model DIR" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_folder_that_is_not_a_checkpoint(tmp_path):
    """No config.json: bad input, refused with the other cheap checks (exit 2); a config.json that
    transformers cannot read: the model cannot be loaded (exit 1)."""
    result = invoke("ask", DATA / "bikes.mp4", "q", "--model", tmp_path)
    assert result.exit_code == 2 and "is not a model checkpoint folder: it has no config.json" in result.stderr
    (tmp_path / "config.json").write_text('{"model_type": ')
    result = invoke("ask", DATA / "bikes.mp4", "q", "--model", tmp_path)
    assert result.exit_code == 1 and "not a loadable checkpoint folder" in result.stderr


def test_not_enough_memory_is_reported(tiny_qwen, monkeypatch):
    """Exhausting a GPU cannot be staged here; the failure is raised where the model would raise it."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    def oom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Qwen25VL, "encode", oom)
    result = invoke("ask", DATA / "bikes.mp4", "q", "--model", tiny_qwen)
    assert result.exit_code == 1 and "not enough memory" in result.stderr


def test_json_stdout_holds_only_the_result(tiny_qwen):
    proc = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", str(DATA / "realshort.mp4"), "What?",
                           "--model", str(tiny_qwen), "--json", "--max-new-tokens", "4"],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["frames"]["count"] == 32 and data["answer"] is not None


def test_library_rejects_unknown_method(tiny_qwen):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.request import Compression, Request
    from ottvid_cli.session import Engine

    with pytest.raises(ValueError):
        Engine(load_backbone(str(tiny_qwen))).ask(DATA / "bikes.mp4", "q", Request(compression=Compression("fast")))


def test_keyframes_take_the_files_key_frames_and_say_how_far(tiny_qwen):
    import av

    with av.open(str(DATA / "cockatoo.mp4")) as container:
        keys = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
    data = as_json(invoke("ask", DATA / "cockatoo.mp4", "What happens?", "--model", tiny_qwen, "--json", "--frames",
                          "8", "--keyframes", "--max-new-tokens", "2"))
    frames = data["frames"]
    assert frames["keyframes"] is True and set(frames["indices"]) <= set(keys)
    assert len(frames["keyframe_offsets"]) == 8 and any("key frames only" in n for n in frames["notes"])
    plain = as_json(invoke("ask", DATA / "cockatoo.mp4", "What happens?", "--model", tiny_qwen, "--json", "--frames",
                           "8", "--max-new-tokens", "2"))
    planned = plain["frames"]["timestamps"]
    assert [round(t - o, 4) for t, o in zip(frames["timestamps"], frames["keyframe_offsets"])] == \
        pytest.approx(planned, abs=1e-3)
    assert plain["frames"]["keyframes"] is False and plain["frames"]["keyframe_offsets"] is None
