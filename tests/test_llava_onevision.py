"""The LLaVA-OneVision adapter on a tiny random checkpoint of the real architecture and real clips."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.llava_onevision import LlavaOneVision
from ottvid_cli.cli import app
from ottvid_cli.compression import OTTVidConfig, compress
from ottvid_cli.video import sample_frames
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def backbone(tiny_llava_ov):
    return load_backbone(str(tiny_llava_ov))


@pytest.fixture(scope="module")
def prepared(backbone):
    clip = sample_frames(DATA / "cockatoo.mp4", 6)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What does the bird do?")
    return inputs, backbone.encode(inputs)


def test_adapter_and_defaults(backbone):
    assert isinstance(backbone, LlavaOneVision)
    assert backbone.default_frames == 32 and backbone.frames_per_group == 1 and not backbone.grounds


def test_196_tokens_per_frame_on_a_14x14_grid(backbone, prepared):
    inputs, visual = prepared
    assert visual.features.shape[:2] == (6, 196) and visual.grid == (14, 14)
    video_tokens = int((inputs["input_ids"] == backbone.video_token_id).sum())
    assert video_tokens == 6 * 196 + 1  # and the newline after the video


def test_saliency_is_siglip_attention_pooled_like_the_features(backbone, prepared):
    inputs, visual = prepared
    attn = backbone.last_vision_attention()
    captured = {}
    hooks = [attn.register_forward_pre_hook(lambda m, a, kw: captured.update(h=kw.get("hidden_states", a[0] if a else None)),
                                            with_kwargs=True)]
    try:
        backbone.model.model.get_video_features(inputs["pixel_values_videos"])
    finally:
        for h in hooks:
            h.remove()
    hidden = captured["h"]  # (T, 729, C)
    t, s, c = hidden.shape
    heads = attn.num_heads
    q = attn.q_proj(hidden).view(t, s, heads, -1).transpose(1, 2)
    k = attn.k_proj(hidden).view(t, s, heads, -1).transpose(1, 2)
    full = torch.softmax(q @ k.transpose(-1, -2) * attn.scale, -1).mean((1, 2))  # (T, 729): heads and queries
    expected = F.interpolate(full.view(t, 1, 27, 27), size=[14, 14], mode="bilinear").view(t, 196)
    torch.testing.assert_close(visual.saliency, expected, rtol=1e-4, atol=1e-7)


def test_ratio_one_is_identical_to_the_stock_model(backbone, prepared):
    inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=1.0))
    assert torch.equal(backbone.prefill_logits(inputs, c.features, c.index), backbone.model(**inputs).logits)
    stock = backbone.model.generate(**inputs, max_new_tokens=16, do_sample=False)[:, inputs["input_ids"].shape[1]:]
    text = backbone.processor.tokenizer.batch_decode(stock, skip_special_tokens=True)[0].strip()
    assert backbone.generate(inputs, c.features, c.index, max_new_tokens=16).text == text


def test_compressed_sequence_keeps_text_kept_tokens_and_the_newline(backbone, prepared):
    inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.1))
    llm = backbone.llm_inputs(inputs, c.features, c.index)
    ids = inputs["input_ids"][0]
    text = int((ids != backbone.video_token_id).sum())
    assert llm["input_ids"].shape[1] == text + c.features.shape[0] + 1
    placed = llm["mm_encoder_outputs"]["video"].pooler_output[0]
    assert placed.shape[0] == c.features.shape[0] + 1 == round(0.1 * 6 * 196) + 1
    torch.testing.assert_close(placed[-1], backbone.model.model.image_newline)
    assert torch.equal(placed[:-1], c.features)
    assert "position_ids" not in llm  # plain 1-D positions, contiguous, from the attention mask


def test_cli_ask_profile_show(tiny_llava_ov, tmp_path):
    result = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", "--model", str(tiny_llava_ov),
                                 "--frames", "8", "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tokens"]["per_group"] == 196 and data["tokens"]["groups"] == 8
    assert data["tokens"]["visual_after"] == round(0.1 * 8 * 196)
    assert data["tokens"]["newline"] == 1  # one newline after the video
    assert data["tokens"]["llm_input"] == data["tokens"]["text"] + data["tokens"]["visual_after"] + 1
    prof = runner.invoke(app, ["profile", str(DATA / "yoga.mp4"), "--model", str(tiny_llava_ov), "--frames", "4",
                               "--repeats", "1", "--warmup", "0", "--json"])
    assert prof.exit_code == 0, prof.output
    rows = json.loads(prof.stdout)["rows"]
    assert rows[0]["visual_tokens"] == 4 * 196 and rows[1]["visual_tokens"] == round(0.1 * 4 * 196)
    assert rows[1]["prefill_tflops"] < rows[0]["prefill_tflops"]
    out = tmp_path / "ov.png"
    shown = runner.invoke(app, ["show", str(DATA / "yoga.mp4"), "-o", str(out), "--model", str(tiny_llava_ov),
                                "--frames", "4", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["tiles"] == 4 and out.exists()


def test_ground_is_refused(tiny_llava_ov):
    result = runner.invoke(app, ["ground", str(DATA / "yoga.mp4"), "a pose", "--model", str(tiny_llava_ov)])
    assert result.exit_code == 2 and "ground needs a Qwen2.5-VL model" in result.stderr


def test_flops_match_pytorchs_counter(tiny_llava_ov):
    backbone = load_backbone(str(tiny_llava_ov), attention="eager")
    clip = sample_frames(DATA / "bikes.mp4", 2)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What?")
    visual = backbone.encode(inputs, saliency=False)
    features, kept = visual.features.reshape(visual.count, -1), torch.arange(visual.count)
    with FlopCounterMode(display=False) as llm_counter:
        length = backbone.prefill(inputs, features, kept)
    with FlopCounterMode(display=False) as vision_counter:
        backbone.model.model.get_video_features(inputs["pixel_values_videos"])
    prefill, vision = backbone.flops(inputs, length)
    assert prefill == llm_counter.get_total_flops()
    assert vision == vision_counter.get_total_flops()
