"""The Qwen2.5-VL adapter on a tiny random checkpoint of the real architecture and a real clip."""

from pathlib import Path

import numpy as np
import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.backbones import load_backbone
from ottvid_cli.compression import OTTVidConfig, compress
from ottvid_cli.request import Compression, Request
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"


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


def full_position_ids(backbone, inputs):
    """The 4-row position ids of the uncompressed prompt: sequence index, then the trained M-RoPE rule."""
    mrope = backbone.positions(inputs)
    return torch.cat([torch.arange(mrope.shape[-1]).view(1, 1, -1), mrope])


def test_ratio_one_is_identical_to_the_stock_model(backbone, prepared):
    """Nothing dropped: our path equals the stock model (vision encoder included) fed the same positions."""
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=1.0))
    ours = backbone.prefill_logits(inputs, c.features, c.index)
    full = full_position_ids(backbone, inputs)
    stock = backbone.model(**inputs, position_ids=full).logits
    assert torch.equal(ours, stock)
    reference = backbone.model.generate(**inputs, position_ids=full, max_new_tokens=24, do_sample=False)
    reference = reference[:, inputs["input_ids"].shape[1]:]
    text = backbone.processor.tokenizer.batch_decode(reference, skip_special_tokens=True)[0].strip()
    assert backbone.generate(inputs, c.features, c.index, max_new_tokens=24).text == text


def test_positions_follow_the_trained_rule_on_a_real_clip(backbone, prepared):
    """Hand-computed from the rule: 16 groups of H' x W' tokens after `start` text tokens, 32 frames
    over the clip's duration (0.625 s a group for a 10 s clip) at 2 tokens per second."""
    clip, inputs, visual = prepared
    ids = inputs["input_ids"][0]
    slots = (ids == backbone.video_token_id).nonzero().flatten()
    start, count = int(slots[0]), slots.numel()
    h, w = visual.grid
    seconds = float(inputs["second_per_grid_ts"][0])
    assert seconds == pytest.approx(2 * clip.duration / 32, rel=1e-6)
    times = [int((torch.tensor(float(t)) * torch.tensor(seconds)) * 2) for t in range(16)]  # float32
    pos = backbone.positions(inputs)[:, 0]
    assert pos[0, slots].tolist() == [start + t for t in times for _ in range(h * w)]
    assert pos[1, slots].tolist() == [start + r for _ in range(16) for r in range(h) for _ in range(w)]
    assert pos[2, slots].tolist() == [start + c for _ in range(16) for _ in range(h) for c in range(w)]
    after = start + max(times[-1], h - 1, w - 1) + 1
    tail = torch.arange(start + count, ids.numel())
    assert all(pos[axis, tail].tolist() == list(range(after, after + tail.numel())) for axis in range(3))
    assert pos[:, :start].tolist() == [list(range(start))] * 3


def test_kept_tokens_keep_their_uncompressed_positions(backbone, prepared):
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.1))
    llm = backbone.llm_inputs(inputs, c.features, c.index)
    full = backbone.positions(inputs)
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


def test_text_after_the_video_keeps_its_place_when_the_end_is_dropped(backbone, prepared):
    """Keep only the first group: the question still starts at the full video's largest position + 1."""
    _, inputs, visual = prepared
    per_group = visual.features.shape[1]
    kept = torch.arange(per_group)
    llm = backbone.llm_inputs(inputs, visual.features[0], kept)
    full = backbone.positions(inputs)[:, 0]
    ids = inputs["input_ids"][0]
    video = (ids == backbone.video_token_id).nonzero().flatten()
    question = llm["position_ids"][1:, 0, int(video[0]) + per_group:]
    assert question[:, 0].tolist() == [int(full[:, video].max()) + 1] * 3
    assert int(full[:, video].max()) > int(full[:, video[:per_group]].max())  # the kept group ends earlier


def test_generated_tokens_continue_after_the_last_prompt_position(backbone, prepared):
    """Each new token goes at the last prompt position + 1 on all three M-RoPE axes (and the sequence
    index L'), the next at + 2: what generate() does with the 4-row position ids we pass."""
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.25))
    llm = backbone.llm_inputs(inputs, c.features, c.index)
    seen = []
    hook = backbone.model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True)
    try:
        backbone.model.generate(**llm, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                pad_token_id=backbone.processor.tokenizer.pad_token_id)
    finally:
        hook.remove()
    length = llm["input_ids"].shape[1]
    last = int(llm["position_ids"][1, 0, -1])
    assert torch.equal(seen[0], llm["position_ids"])
    assert seen[1].flatten().tolist() == [length, last + 1, last + 1, last + 1]  # first generated token
    assert seen[2].flatten().tolist() == [length + 1, last + 2, last + 2, last + 2]  # second


def test_pipeline_counts_and_timings(backbone):
    from ottvid_cli.session import Engine

    result = Engine(backbone).ask(DATA / "yoga.mp4", "Is the camera moving?",
                                  Request(pipeline.Sampling(frames=16), Compression(ratio=0.25), max_new_tokens=8))
    tokens = result.tokens
    assert tokens["visual_after"] == round(0.25 * tokens["visual_before"])
    assert tokens["llm_input"] == tokens["text"] + tokens["visual_after"]
    assert result.frames["count"] == 16 and len(result.frames["timestamps"]) == 16
    assert set(result.timings_ms) == {"decode", "preprocess", "vision", "saliency", "compression", "prefill",
                                      "generate"}
    assert all(v is not None and v >= 0 for v in result.timings_ms.values())
    assert result.compression["kept"] == tokens["visual_after"]


def test_method_none_keeps_every_token(backbone):
    from ottvid_cli.session import Engine

    result = Engine(backbone).ask(DATA / "yoga.mp4", "Is the camera moving?",
                                  Request(pipeline.Sampling(frames=16), Compression("none"), max_new_tokens=8))
    assert result.compression is None and result.timings_ms["compression"] is None
    assert result.tokens["visual_after"] == result.tokens["visual_before"]


@pytest.fixture(scope="module")
def real_range(tmp_path_factory):
    """A tiny Qwen2.5-VL whose processor has the 7B's pixel range (128 to 768 merged tokens a frame)."""
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen-range"), min_pixels=128 * 28 * 28,
                                 max_pixels=768 * 28 * 28)
    return load_backbone(str(path))


@pytest.mark.parametrize("height, width, ours, lmms", [
    # 640x360 (230,400 px): ours (at most 448 x 448) shrinks it by sqrt(230400 / 200704) and floors to 28;
    # lmms-eval's range keeps round(360 / 28) x round(640 / 28) = 13 x 23 patches of 28
    (360, 640, (336, 588), (364, 644)),
    # 320x240 (76,800 px): raised to the processor's minimum (100,352) for ours, to lmms-eval's 200,704
    # (sqrt(200704 / 76800) = 1.617; 240 x 1.617 = 388 -> 392, 320 x 1.617 = 517 -> 532) for theirs
    (240, 320, (280, 392), (392, 532)),
    # 1280x720: qwen-vl-utils caps a frame at 768 merged tokens (602,112 px) whatever max_pixels says:
    # sqrt(921600 / 602112) = 1.237; 720 / 1.237 = 582 -> 560, 1280 / 1.237 = 1035 -> 1008
    (720, 1280, (336, 588), (560, 1008)),
])
def test_frame_sizes_with_our_default_and_with_lmms_evals_pixel_range(real_range, height, width, ours, lmms):
    """Hand-computed smart_resize: the product's default cap (448 x 448) and lmms-eval's Qwen2.5-VL
    range (min 256 x 28 x 28, max 1605632, which qwen-vl-utils caps at 768 tokens), 32 frames."""
    assert real_range.frame_size(height, width, 32) == ours
    saved = real_range.max_pixels, real_range.min_pixels
    real_range.max_pixels, real_range.min_pixels = real_range.lmms_pixels["max_pixels"], real_range.lmms_pixels["min_pixels"]
    try:
        assert real_range.frame_size(height, width, 32) == lmms
    finally:
        real_range.max_pixels, real_range.min_pixels = saved


def test_a_very_narrow_frame_keeps_a_side_of_one_patch(backbone):
    """16 x 3000 (an odd but legal video, aspect 187 < qwen-vl-utils' 200): where smart_resize shrinks
    the frame (the tiny checkpoint's small pixel range here; a real one with --max-pixels under
    200 x 28 x 28), qwen-vl-utils floors the 16-pixel side to 0 and the resize failed; it stays one
    28-pixel patch wide, as transformers' smart_resize keeps it, and the frames go through."""
    height, width = backbone.frame_size(3000, 16, 8)
    assert width == 28 and height % 28 == 0
    assert backbone.frame_size(16, 3000, 8) == (width, height)
    frames = np.zeros((8, 3000, 16, 3), np.uint8)
    inputs = backbone.preprocess(frames, [i / 8 for i in range(8)], 1.0, "What happens?")
    assert inputs["video_grid_thw"].tolist() == [[4, height // 14, 2]]


def test_frames_beyond_the_processors_aspect_limit_are_a_video_error(backbone):
    """4000 x 16 (aspect 250): the Qwen processors' smart_resize refuses it with a ValueError of theirs,
    which would read as our bug (an internal error): it is said in the video's terms instead."""
    from ottvid_cli.video import VideoError

    with pytest.raises(VideoError, match=r"frames of 4000 x 16 pixels: Qwen2.5-VL takes frames whose long side is "
                                         r"at most 200 times the short one"):
        backbone.frame_size(16, 4000, 8)
    assert backbone.frame_size(16, 3200, 8)[0] >= 28  # aspect 200 exactly: as qwen-vl-utils, accepted


def test_the_pixel_range_is_a_sampling_setting_and_is_put_back(real_range):
    from ottvid_cli.sampling import Sampling

    lmms = Sampling(frames=4, min_pixels=256 * 28 * 28, max_pixels=1605632)
    big = pipeline.prepare(real_range, DATA / "yoga.mp4", lmms, "none")  # yoga: 568x320
    small = pipeline.prepare(real_range, DATA / "yoga.mp4", Sampling(frames=4), "none")
    assert big.visual.grid == (13, 22) and small.visual.grid[0] * small.visual.grid[1] < 13 * 22  # 364 x 616 px
    assert (real_range.max_pixels, real_range.min_pixels) == (448 * 448, None)
