"""`ottvid convert llava-video` on a tiny checkpoint written in the LLaVA-NeXT layout, then loaded and run."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ottvid_cli.backbones import load_backbone
from ottvid_cli.cli import app
from ottvid_cli.compression import OTTVidConfig, compress
from ottvid_cli.convert import rename
from ottvid_cli.tiny import build_tiny_llava_onevision
from ottvid_cli.video import sample_frames
from tests.support.cli import runner
from tests.support.tiny_models import build_tiny_llava_next

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    """A LLaVA-NeXT folder: LlavaQwen config, renamed weights (in two shards, with the unused SigLIP
    head), a plain Qwen2 tokenizer without <image> / <video>."""
    ov = build_tiny_llava_onevision(tmp_path_factory.mktemp("ov"))
    src = tmp_path_factory.mktemp("llava-next")
    return src, build_tiny_llava_next(src, ov)


@pytest.fixture(scope="module")
def converted(llava_next, tmp_path_factory):
    src, _ = llava_next
    dst = tmp_path_factory.mktemp("converted")
    result = runner.invoke(app, ["convert", "llava-video", str(src), str(dst), "--vision-heads", "2", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert "169 tokens a frame" in result.stdout
    return dst


def test_every_weight_lands_unchanged(llava_next, converted):
    _, tensors = llava_next
    written = {}
    for shard in converted.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as reader:
            written.update({k: reader.get_tensor(k) for k in reader.keys()})
    for name, tensor in tensors.items():
        new = rename(name)
        if new is None:
            assert ".head." in name
            continue
        assert torch.equal(written[new], tensor), name
    assert len(written) == len(tensors) - 1
    index = json.loads((converted / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(written)
    # and they load where they belong
    model = load_backbone(str(converted)).model
    assert torch.equal(model.model.multi_modal_projector.linear_1.weight, tensors["model.mm_projector.0.weight"])
    assert torch.equal(model.model.image_newline, tensors["model.image_newline"])
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(model.model.language_model.layers[1].mlp.up_proj.weight,
                       tensors["model.layers.1.mlp.up_proj.weight"])
    tower = model.model.vision_tower
    assert torch.equal(getattr(tower, "vision_model", tower).encoder.layers[0].self_attn.q_proj.weight,
                       tensors["model.vision_tower.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight"])
    settings = json.loads((converted / "ottvid.json").read_text())
    assert settings["mm_spatial_pool_mode"] == "average" and settings["mm_newline_position"] == "frame"


def test_converted_model_pools_to_169_with_a_newline_per_frame(converted):
    backbone = load_backbone(str(converted))
    assert backbone.grid == (13, 13) and backbone.default_frames == 64 and backbone.newline_position == "frame"
    clip = sample_frames(DATA / "bikes.mp4", 4)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")
    assert int((inputs["input_ids"] == backbone.video_token_id).sum()) == 4 * (169 + 1)
    visual = backbone.encode(inputs)
    assert visual.features.shape[:2] == (4, 169) and visual.saliency.shape == (4, 169)
    # the features are SigLIP -> projector -> 2x2 average pooling of the 27 x 27 grid
    vision = backbone.model.model.vision_tower(inputs["pixel_values_videos"][0], output_hidden_states=True)
    projected = backbone.model.model.multi_modal_projector(vision.hidden_states[-1])
    pooled = torch.nn.functional.avg_pool2d(projected.transpose(1, 2).reshape(4, -1, 27, 27), 2)
    torch.testing.assert_close(visual.features, pooled.flatten(2).transpose(1, 2))
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.1))
    llm = backbone.llm_inputs(inputs, c.features, c.index)
    placed = llm["mm_encoder_outputs"]["video"].pooler_output[0]
    assert placed.shape[0] == c.features.shape[0] + 4  # one newline per frame, all kept
    newline = torch.all(placed == backbone.model.model.image_newline, dim=-1)
    kept_per_frame = torch.bincount(c.index // 169, minlength=4)
    after_each_frame = torch.cumsum(kept_per_frame, 0) + torch.arange(4)  # slot of frame f's newline
    assert newline.nonzero().flatten().tolist() == after_each_frame.tolist()


def test_ratio_one_matches_the_uncompressed_path(converted):
    backbone = load_backbone(str(converted))
    clip = sample_frames(DATA / "yoga.mp4", 4)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "Describe.")
    visual = backbone.encode(inputs)
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=1.0))
    everything = torch.arange(visual.count)
    flat = visual.features.reshape(visual.count, -1)
    assert torch.equal(backbone.prefill_logits(inputs, c.features, c.index),
                       backbone.prefill_logits(inputs, flat, everything))


def test_cli_ask_on_the_converted_model(converted):
    result = runner.invoke(app, ["ask", str(DATA / "realshort.mp4"), "What happens?", "--model", str(converted),
                                 "--frames", "4", "--max-new-tokens", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tokens"]["per_group"] == 169 and data["tokens"]["visual_after"] == round(0.1 * 4 * 169)
    assert data["tokens"]["newline"] == 4  # one after every frame
    assert data["tokens"]["llm_input"] == data["tokens"]["text"] + data["tokens"]["visual_after"] + 4


def test_conversion_errors(tmp_path, llava_next):
    src, _ = llava_next
    result = runner.invoke(app, ["convert", "llava-video", str(tmp_path / "nothing"), str(tmp_path / "out")])
    assert result.exit_code == 2 and "no config.json" in result.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["convert", "llava-video", str(src), str(busy), "--vision-heads", "2"])
    assert result.exit_code == 2 and "not empty" in result.stderr and (busy / "keep.txt").read_text() == "mine"
    result = runner.invoke(app, ["convert", "llava-video", str(src), str(tmp_path / "new")])
    assert result.exit_code == 2 and "--vision-heads" in result.stderr


def test_cli_profile_on_the_converted_model(converted):
    result = runner.invoke(app, ["profile", str(DATA / "yoga.mp4"), "--model", str(converted), "--frames", "2",
                                 "--repeats", "1", "--warmup", "0", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert rows[0]["visual_tokens"] == 2 * 169 and rows[1]["visual_tokens"] == round(0.1 * 2 * 169)
    assert rows[0]["llm_input_tokens"] - rows[1]["llm_input_tokens"] == 2 * 169 - round(0.1 * 2 * 169)


def test_unconverted_folder_is_refused_with_advice(llava_next):
    src, _ = llava_next
    result = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "q", "--model", str(src)])
    assert result.exit_code == 1 and "ottvid convert llava-video" in result.stderr
