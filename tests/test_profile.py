"""`ottvid profile` and the FLOP formulas, on the tiny Qwen2.5-VL."""

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from ottvid_cli.backbones import load_backbone
from ottvid_cli.cli import app
from ottvid_cli.flops import llm_prefill_flops, vision_flops
from ottvid_cli.profile import synthetic_video
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"
runner = CliRunner()
STAGES = {"preprocess", "vision", "prefill", "ttft", "decode"}


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


@pytest.fixture(scope="module")
def profiled(tiny_qwen):
    result = invoke("profile", DATA / "bikes.mp4", "--model", tiny_qwen, "--ratio", "0.1", "--ratio", "0.25",
                    "--frames", "16", "--repeats", "2", "--warmup", "1", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_rows_and_columns(profiled):
    assert set(profiled) >= {"model", "device", "frames", "rows"}
    assert profiled["frames"]["count"] == 16 and profiled["device"] == "cpu"
    rows = profiled["rows"]
    assert [(r["method"], r["ratio"]) for r in rows] == [("none", 1.0), ("ottvid", 0.1), ("ottvid", 0.25)]
    keys = {"method", "ratio", "visual_tokens", "llm_input_tokens", "timings_ms", "ttft_ms", "ttft_speedup",
            "peak_memory_mb", "memory_kind", "prefill_tflops", "vision_tflops"}
    for row in rows:
        assert keys <= set(row)
        assert row["memory_kind"] == "peak RSS growth" and row["peak_memory_mb"] >= 0
        expected = STAGES | ({"saliency", "compression"} if row["method"] == "ottvid" else set())
        assert expected <= set(row["timings_ms"])
        for stat in row["timings_ms"].values():
            assert stat["min"] <= stat["median"] <= stat["max"]
        t = row["timings_ms"]
        parts = sum(t[k]["median"] for k in ("vision", "saliency", "compression", "prefill") if k in t)
        assert row["ttft_ms"] == t["ttft"]["median"] and row["ttft_ms"] == pytest.approx(parts, rel=0.5)
    ottvid = rows[1]
    stages = {k for k in ottvid["timings_ms"] if k.startswith("compression.")}
    assert stages == {f"compression.{s}" for s in ("similarity", "selection", "mass", "cost", "sinkhorn", "budget",
                                                   "merge")}
    assert rows[0]["ttft_speedup"] == 1.0
    assert ottvid["ttft_speedup"] == pytest.approx(rows[0]["ttft_ms"] / ottvid["ttft_ms"])


def test_compression_feeds_fewer_tokens_and_flops_fall_with_the_ratio(profiled):
    vanilla, r10, r25 = profiled["rows"]
    assert r10["visual_tokens"] < r25["visual_tokens"] < vanilla["visual_tokens"]
    assert r10["visual_tokens"] == round(0.1 * vanilla["visual_tokens"])
    assert r10["llm_input_tokens"] - r10["visual_tokens"] == vanilla["llm_input_tokens"] - vanilla["visual_tokens"]
    assert r10["prefill_tflops"] < r25["prefill_tflops"] < vanilla["prefill_tflops"]
    assert r10["vision_tflops"] == vanilla["vision_tflops"]  # the encoder sees every frame either way


def test_flops_match_pytorchs_counter_and_a_hand_count(tiny_qwen):
    backbone = load_backbone(str(tiny_qwen), attention="eager")  # explicit matmuls the counter can see
    clip = sample_frames(DATA / "bikes.mp4", 8)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What?")
    visual = backbone.encode(inputs, saliency=False)
    features, kept = visual.features.reshape(visual.count, -1), torch.arange(visual.count)
    with FlopCounterMode(display=False) as llm_counter:
        length = backbone.prefill(inputs, features, kept)
    with FlopCounterMode(display=False) as vision_counter:
        backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    prefill, vision = backbone.flops(inputs, length)
    assert prefill == llm_counter.get_total_flops()
    assert vision == vision_counter.get_total_flops()
    # by hand for the tiny text model: h=64, 4 heads of 16, 2 kv heads, MLP 128, 2 layers, vocab 534
    per_layer = (2 * length * 64 * 64 + 2 * 2 * length * 64 * 32 + 2 * length * 64 * 64
                 + 2 * 2 * 4 * length * length * 16 + 3 * 2 * length * 64 * 128)
    assert prefill == 2 * per_layer + 2 * 64 * 534
    text = backbone.model.config.text_config
    assert llm_prefill_flops(text, 100) < llm_prefill_flops(text, 200)


def test_vision_flops_by_hand(tiny_qwen):
    config = load_backbone(str(tiny_qwen)).model.config.vision_config
    # one group of 4 x 4 patches, one window of 16: C=64, I=128, merge 2x2, out 64, 2 blocks
    s = 16
    block = 2 * s * 64 * 192 + 2 * s * 64 * 64 + 3 * 2 * s * 64 * 128 + 2 * 2 * 64 * 16**2
    merger = 2 * 4 * 256 * 256 + 2 * 4 * 256 * 64
    assert vision_flops(config, (1, 4, 4), [16]) == 2 * s * (3 * 2 * 14 * 14) * 64 + 2 * block + merger


def test_profile_without_a_video_uses_a_synthetic_clip(tiny_qwen):
    result = invoke("profile", "--model", tiny_qwen, "--repeats", "1", "--warmup", "0", "--seconds", "3",
                    "--size", "224x168", "--frames", "8", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["frames"]["count"] == 8 and data["frames"]["duration"] == 3.0
    assert [r["ratio"] for r in data["rows"]] == [1.0, 0.1]


def test_human_table_has_every_column(tiny_qwen):
    result = invoke("profile", "--model", tiny_qwen, "--repeats", "1", "--warmup", "0", "--seconds", "2",
                    "--size", "112x112", "--fps", "2", env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    for column in ("visual tokens", "LLM input", "decode", "preprocess", "vision", "saliency", "compression",
                   "prefill", "TTFT", "speed-up", "peak MB", "prefill TFLOPs", "vision TFLOPs", "vanilla",
                   "OTT-Vid 0.1", "sinkhorn", "peak RSS growth"):
        assert column in result.stdout


def test_synthetic_clip_moves():
    clip = synthetic_video(seconds=4, width=96, height=64, frames=6)
    assert clip.frames.shape == (6, 64, 96, 3) and clip.duration == 4
    assert clip.timestamps == sorted(clip.timestamps)
    assert (clip.frames[0].astype(int) - clip.frames[-1].astype(int)).std() > 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ratio", "0"], "--ratio must be in (0, 1]"),
        (["--frames", "8", "--fps", "2"], "not both"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--size", "big"], "--size must look like"),
        ([DATA / "missing.mp4"], "video not found"),
    ],
)
def test_bad_arguments(tiny_qwen, args, message):
    result = invoke("profile", *args, "--model", tiny_qwen)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""
