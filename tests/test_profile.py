"""`ottvid profile` and the FLOP formulas, on the tiny Qwen2.5-VL."""

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ottvid_cli.backbones import load_backbone
from ottvid_cli.flops import llm_prefill_flops, vision_flops
from ottvid_cli.profile import synthetic_video
from ottvid_cli.video import sample_frames
from tests.support.cli import invoke

DATA = Path(__file__).parent / "data"
STAGES = {"preprocess", "vision", "prefill", "ttft", "decode"}


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


def test_first_calls_are_reported_apart(profiled):
    first = profiled["first_call_ms"]
    assert set(first) == {"preprocess", "vision", "saliency", "prefill", "compression"}
    assert all(v > 0 for v in first.values())


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


def test_first_calls_fold_into_a_narrow_terminal():
    """The first-call note was one 120-column line that folded badly at 100 columns."""
    import io

    from rich.console import Console

    from ottvid_cli.cli.report import render_profile

    timings = {k: {"median": 12.0, "min": 11.0, "max": 13.0} for k in ("decode", "preprocess", "vision",
                                                                       "saliency", "compression", "prefill", "ttft")}
    row = {"method": "none", "ratio": 1.0, "visual_tokens": 100, "llm_input_tokens": 130, "timings_ms": timings,
           "ttft_speedup": 1.0, "peak_memory_mb": 10.0, "prefill_tflops": 0.1, "vision_tflops": 0.1,
           "memory_kind": "peak RSS growth"}
    data = {"rows": [row, {**row, "method": "ottvid", "ratio": 0.1}], "model": "m", "device": "cpu",
            "frames": {"count": 8, "duration": 3.0}, "repeats": 1, "warmup": 0,
            "first_call_ms": {"preprocess": 2345.6, "vision": 3456.7, "saliency": 456.7, "compression": 56.7,
                              "prefill": 1234.5}}
    screen = io.StringIO()
    render_profile(data, Console(file=screen, width=100, color_system=None))
    lines = screen.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    first = lines.index(next(line for line in lines if "first calls in this process (ms)" in line))
    table = "\n".join(lines[first:first + 12])
    assert "2,346" in table and "3,457" in table and "first-call overheads):" not in screen.getvalue()


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
                   "OTT-Vid 0.1", "sinkhorn", "peak RSS growth", "first calls in this process"):
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
        (["--repeats", "0"], "--repeats must be an integer >= 1"),
        (["--size", "big"], "--size must look like"),
        ([DATA / "missing.mp4"], "video not found"),
    ],
)
def test_bad_arguments(tiny_qwen, args, message):
    result = invoke("profile", *args, "--model", tiny_qwen)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""


def profile_data(ratios):
    """What `profile --json` returns, with times in the thousands of ms (a 7B model on a long clip)."""
    def stat(median, low, high):
        return {"median": median, "min": low, "max": high}

    rows = [{"method": "none", "ratio": 1.0, "visual_tokens": 16384, "llm_input_tokens": 16441,
             "timings_ms": {"decode": stat(1234.4, 1200.2, 1300.9), "preprocess": stat(412.3, 400.1, 430.2),
                            "vision": stat(10234.4, 10001.2, 10999.1), "prefill": stat(23456.7, 23000.1, 24000.4),
                            "ttft": stat(33691.1, 33300.2, 34400.3)},
             "ttft_ms": 33691.1, "ttft_speedup": 1.0, "peak_memory_mb": 63456.0, "memory_kind": "cuda max allocated",
             "prefill_tflops": 261.0, "vision_tflops": 98.7}]
    for i, ratio in enumerate(ratios):
        t = {"decode": stat(1234.4, 1200.2, 1300.9), "preprocess": stat(412.3, 400.1, 430.2),
             "vision": stat(10234.4, 10001.2, 10999.1), "saliency": stat(12.3, 11.9, 14.0),
             "compression": stat(45.6 + i, 40.1, 50.2), "prefill": stat(2345.6 + i, 2300.0, 2400.4),
             "ttft": stat(12637.9 + i, 12400.0, 13300.3)}
        t.update({f"compression.{s}": stat(1.5 + k + i, 1.0, 9.0) for k, s in enumerate(
            ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge"))})
        rows.append({"method": "ottvid", "ratio": ratio, "visual_tokens": round(16384 * ratio),
                     "llm_input_tokens": round(16384 * ratio) + 57, "timings_ms": t, "ttft_ms": t["ttft"]["median"],
                     "ttft_speedup": 33691.1 / t["ttft"]["median"], "peak_memory_mb": 40456.0 + i,
                     "memory_kind": "cuda max allocated", "prefill_tflops": 261.0 * ratio, "vision_tflops": 98.7})
    return {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "device": "NVIDIA H100 80GB HBM3",
            "frames": {"count": 768, "duration": 384.0}, "repeats": 5, "warmup": 1, "rows": rows}


@pytest.mark.parametrize("width, ratios", [(100, (0.1, 0.25)), (100, (0.1, 0.15, 0.2, 0.25, 0.3, 0.5)),
                                           (80, (0.1, 0.25))])
def test_human_table_fits_the_terminal_and_cuts_no_number(width, ratios):
    from rich.console import Console

    from ottvid_cli.cli.report import render_profile

    console = Console(width=width, record=True, force_terminal=False)
    render_profile(profile_data(ratios), console)
    text = console.export_text()
    assert "…" not in text and "..." not in text
    assert max(len(line) for line in text.splitlines()) <= width
    expected = ["16,384", "16,441", "1,234", "1,200-1,301", "412.3", "400.1-430.2", "10,234", "10,001-10,999",
                "23,457", "23,000-24,000", "33,691", "33,300-34,400", "63,456", "261", "98.7", "12.3",
                "11.9-14.0", "1.00x", "vanilla"]
    for i, ratio in enumerate(ratios):
        tokens = round(16384 * ratio)
        expected += [f"OTT-Vid {ratio:g}", f"{tokens:,}", f"{tokens + 57:,}", f"{45.6 + i:.1f}", "40.1-50.2",
                     f"{2345.6 + i:,.0f}", "2,300-2,400", f"{12637.9 + i:,.0f}", "12,400-13,300",
                     f"{33691.1 / (12637.9 + i):.2f}x", f"{40456 + i:,}", f"{261.0 * ratio:.3g}",
                     *(f"{1.5 + k + i:.1f}" for k in range(7))]
    for value in expected:
        assert value in text, value


@pytest.mark.parametrize("columns", [80, 100])
def test_every_line_fits_the_terminal_piped(tiny_qwen, columns):
    """`COLUMNS=100 ottvid profile VIDEO ... | less` printed its note on times as one 249-column
    line; piped, the note wraps as prose at the terminal's width and every table fits it, no word broken."""
    result = invoke("profile", DATA / "bikes.mp4", "--model", tiny_qwen, "--ratio", "0.1", "--frames", "8",
                    "--repeats", "1", "--warmup", "0", "--quiet", env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    assert "…" not in result.stdout
    assert ("times in ms: median, then min-max of 1 runs after 0 warm-up; preprocess, vision and saliency: one "
            "encoding shared by every run; TTFT = vision + saliency + compression + prefill") in " ".join(result.stdout.split())
    words = set(result.stdout.replace("│", " ").replace("┃", " ").split())
    assert {"vanilla", "OTT-Vid", "0.1", "preprocess", "compression", "sinkhorn", "TFLOPs"} <= words
