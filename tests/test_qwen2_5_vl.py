"""The Qwen2.5-VL adapter on a tiny random checkpoint of the real architecture and a real clip."""

from pathlib import Path

import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.backbones import load_backbone
from ottvid_cli.compression import OTTVidConfig, compress
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def backbone(tiny_qwen):
    return load_backbone(str(tiny_qwen))


@pytest.fixture(scope="module")
def prepared(backbone):
    clip = sample_frames(DATA / "bikes.mp4", 32)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens in the video?")
    return clip, inputs, backbone.encode(inputs)


def test_loads_on_cpu_in_float32(backbone):
    assert backbone.device.type == "cpu" and backbone.model.dtype == torch.float32
    assert backbone.model.config._attn_implementation == "sdpa"


def test_visual_tokens_shape_and_real_time_positions(backbone, prepared):
    clip, inputs, visual = prepared
    t, h, w = inputs["video_grid_thw"][0].tolist()
    assert t == 16 and visual.features.shape[:2] == (16, (h // 2) * (w // 2)) and visual.grid == (h // 2, w // 2)
    # 32 frames over 10 s: 3.2 frames/s, so a temporal group of 2 frames spans 0.625 s
    assert inputs["second_per_grid_ts"].tolist() == pytest.approx([2 / (32 / clip.duration)])


def test_saliency_is_a_distribution_per_group(prepared):
    _, _, visual = prepared
    assert visual.saliency.shape == visual.features.shape[:2]
    assert torch.all(visual.saliency >= 0)
    torch.testing.assert_close(visual.saliency.sum(-1), torch.ones(visual.saliency.shape[0]))


def test_window_order_is_undone_like_the_towers_merger(backbone, prepared):
    _, inputs, visual = prepared
    captured = {}
    merger = backbone.model.model.visual.merger
    handle = merger.register_forward_hook(lambda m, args, out: captured.update(window_order=out))
    try:
        out = backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    finally:
        handle.remove()
    window_order = captured["window_order"]
    raster = backbone.window_to_raster(window_order, inputs["video_grid_thw"])
    assert not torch.equal(window_order, raster)  # the grid is wider than a window: a real permutation
    torch.testing.assert_close(raster, out.pooler_output[0], rtol=0, atol=0)
    torch.testing.assert_close(raster, visual.features.reshape(raster.shape), rtol=0, atol=0)


def test_ratio_one_is_identical_to_the_stock_model(backbone, prepared):
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=1.0))
    ours = backbone.prefill_logits(inputs, c.features, c.index)
    stock = backbone.model(**inputs).logits
    assert torch.equal(ours, stock)
    reference = backbone.model.generate(**inputs, max_new_tokens=24, do_sample=False)
    reference = reference[:, inputs["input_ids"].shape[1]:]
    text = backbone.processor.tokenizer.batch_decode(reference, skip_special_tokens=True)[0].strip()
    assert backbone.generate(inputs, c.features, c.index, max_new_tokens=24).text == text


def test_kept_tokens_keep_their_uncompressed_positions(backbone, prepared):
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.1))
    llm = backbone.llm_inputs(inputs, c.features, c.index)
    full, _ = backbone.model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"], attention_mask=inputs["attention_mask"])
    ids = inputs["input_ids"][0]
    video_slots = (ids == backbone.video_token_id).nonzero().flatten()
    text_slots = (ids != backbone.video_token_id).nonzero().flatten()
    expected_slots = torch.sort(torch.cat([text_slots, video_slots[c.index]])).values
    positions = llm["position_ids"]
    assert positions.shape == (4, 1, expected_slots.numel())
    assert torch.equal(positions[1:, 0], full[:, 0, expected_slots])  # text after the video included
    assert torch.equal(positions[0, 0], torch.arange(expected_slots.numel()))
    assert torch.equal(llm["input_ids"][0], ids[expected_slots])
    # the LLM input is the text tokens plus the kept visual tokens
    assert llm["input_ids"].shape[1] == text_slots.numel() + c.features.shape[0]
    assert int((llm["input_ids"] == backbone.video_token_id).sum()) == c.features.shape[0]
    assert c.features.shape[0] == round(0.1 * visual.count)


def test_pipeline_counts_and_timings(backbone):
    result = pipeline.ask(backbone, DATA / "yoga.mp4", "Is the camera moving?", frames=16, ratio=0.25,
                          max_new_tokens=8)
    tokens = result.tokens
    assert tokens["visual_after"] == round(0.25 * tokens["visual_before"])
    assert tokens["llm_input"] == tokens["text"] + tokens["visual_after"]
    assert result.frames["count"] == 16 and len(result.frames["timestamps"]) == 16
    assert set(result.timings_ms) == {"decode", "preprocess", "vision", "saliency", "compression", "prefill",
                                      "generate"}
    assert all(v is not None and v >= 0 for v in result.timings_ms.values())
    assert result.compression["kept"] == tokens["visual_after"]


def test_method_none_keeps_every_token(backbone):
    result = pipeline.ask(backbone, DATA / "yoga.mp4", "Is the camera moving?", frames=16, method="none",
                          max_new_tokens=8)
    assert result.compression is None and result.timings_ms["compression"] is None
    assert result.tokens["visual_after"] == result.tokens["visual_before"]
