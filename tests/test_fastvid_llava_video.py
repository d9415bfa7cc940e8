"""fastvid's LLaVA-Video path (docs/methods.md, "fastvid"): the budget split and the per-frame steps by
hand, the official block (fastvid_llavavideo modeling_qwen2.py) on the same tensors, and a converted
LLaVA-Video checkpoint picking the path (and its SigLIP head's average-pooled attention) through
pipeline.prepare."""

import pytest
import torch
import torch.nn.functional as F

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.fastvid import FastVIDConfig, segment_plan, video_plan
from ottvid_cli.request import Compression
from test_fastvid_onevision import ATTENTION, FRAME, siglip_heads  # noqa: F401 (a fixture)
from test_methods import check_contract, official_or_skip, tokens

VIDEO = {"path": "llava_video", "tau": 0.9}


def video(x, s, grid, ratio, **options):
    return methods.compress_with("fastvid", x, s, grid, ratio=ratio, **{**VIDEO, **options})


def cfg(**options) -> FastVIDConfig:
    return FastVIDConfig(**{**VIDEO, **options})


# ------------------------------------------------------------------------------------------------
# The budget split (video_plan)


def test_plan_spreads_salient_evenly_and_anchors_from_the_end():
    # N = 169, r = 0.1: R = 16; a segment of 5 frames has 80 tokens: int(80 * 0.4) = 32 contextual, 48
    # salient = 10, 10, 10, 9, 9 (the first frames take the remainder); p = 4: ceil(5 / 4) = 2 anchor
    # frames, frames 4 and 0 (counted from the end), 16 each
    assert video_plan(80, 5, 169, cfg()) == [(10, 16), (10, 0), (10, 0), (9, 0), (9, 16)]
    # p = 2: 3 anchor frames (4, 2, 0); 32 = 11 + 11 + 10, the largest shares from the end
    assert video_plan(80, 5, 169, cfg(p=2)) == [(10, 10), (10, 0), (10, 11), (9, 0), (9, 11)]
    # one frame: both shares on it (the official cur_seg_len == 1 branch)
    assert video_plan(16, 1, 169, cfg()) == [(10, 6)]


def test_plan_differs_from_the_qwen_plan():
    # no minimum contextual token: a budget of 2 keeps 2 salient tokens (the Qwen2.5-VL path: 1 + 1)
    assert video_plan(2, 1, 64, cfg()) == [(2, 0)]
    assert segment_plan(2, [], 64, FastVIDConfig()) == [(1, 1)]
    # no grouping of near-identical frames, no N // 2 cap: 4 frames of similarity 0.99, budget 96 of N = 64
    # (38 contextual on the last frame, 58 salient = 15, 15, 14, 14); the Qwen2.5-VL path makes them one
    # group whose last frame keeps min(38, 32) contextual and min(58, 64 - 32) salient tokens
    assert video_plan(96, 4, 64, cfg()) == [(15, 0), (15, 0), (14, 0), (14, 38)]
    assert segment_plan(96, [0.99] * 3, 64, FastVIDConfig()) == [(0, 0), (0, 0), (0, 0), (32, 32)]


def test_plan_caps_anchors_at_the_tokens_left():
    # N = 10, budget 18 on 2 frames: 7 contextual on frame 1, 11 salient = 6, 5: frame 1 has 5 tokens left
    # (the official topk would fail)
    assert video_plan(18, 2, 10, cfg()) == [(6, 0), (5, 5)]


# ------------------------------------------------------------------------------------------------
# The per-frame steps and DTM by hand (FRAME: 3 attended tokens, a tight cluster around token 4, a
# lone token 7)


def test_one_frame_by_hand():
    # R = 4: 1 contextual, 3 salient (0, 1, 2); the density peak 4 is the anchor and every other
    # non-salient token joins it, the anchor itself not: 0.6 x 4 + 0.4 x mean(3, 5, 6, 7)
    out = video(FRAME[None], ATTENTION[None], (2, 4), 0.5, exact=False)
    assert out.report.details["per_frame"] == [[3, 1]]
    assert out.index.tolist() == [0, 1, 2, 4]
    assert torch.equal(out.features[:3], FRAME[:3])
    torch.testing.assert_close(out.features[3], 0.6 * FRAME[4] + 0.4 * FRAME[[3, 5, 6, 7]].mean(0))


def test_two_frames_by_hand():
    # one segment of two identical frames, R = int(8 * 0.25) = 2: 4 tokens, int(1.6) = 1 contextual, 3
    # salient = 2 (frame 0: tokens 0, 1) + 1 (frame 1: token 0, flat 8); the anchor on the last frame:
    # its density peak among tokens 1-7, token 4 (flat 12). Every non-salient token of the segment
    # but the anchor joins it: 12 tokens, w = max(1 / 13, 0.6)
    x, s = torch.stack([FRAME, FRAME]), torch.stack([ATTENTION, ATTENTION])
    out = video(x, s, (2, 4), 0.25, exact=False, c=1, tau=-1.0)
    assert out.report.details["segments"] == [2]
    assert out.report.details["per_frame"] == [[2, 0], [1, 1]]
    assert out.index.tolist() == [0, 1, 8, 12]
    flat = x.reshape(16, 2)
    joined = [2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 14, 15]
    torch.testing.assert_close(out.features[3], 0.6 * flat[12] + 0.4 * flat[joined].mean(0))
    assert out.assignment.tolist() == [0, 1, 3, 3, 3, 3, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3]
    check_contract(out, x, 0.25, exact=False)


def test_signals_drive_dyseg_and_the_salient_tokens():
    x, s, grid = tokens(4, 2, 5, 6, seed=1, drift=0.01)  # near-identical frames
    frame_features = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.1]])
    attention = torch.rand(4, 10, generator=torch.Generator().manual_seed(2))
    signals = {"frame_features": frame_features, "attention": attention, "source": "siglip_head"}
    out = video(x, s, grid, 0.5, exact=False, c=2, signals=signals)
    assert out.report.details["segments"] == [2, 2] and out.report.details["signals"] == "siglip_head"
    # R = 5 per frame, 10 a segment: 4 contextual on its last frame, 6 salient = 3 + 3
    assert out.report.details["per_frame"] == [[3, 0], [3, 4], [3, 0], [3, 4]]
    kept = torch.zeros(40, dtype=torch.bool)
    kept[out.index] = True
    assert bool(kept.view(4, 10).gather(1, attention.argsort(-1, descending=True)[:, :3]).all())
    assert video(x, s, grid, 0.5, exact=False, c=2).report.details["signals"] == "fallback"


# ------------------------------------------------------------------------------------------------
# Counts


def test_paper_shape_counts():
    # 64 x 169 at 0.1: int(16.9) = 16 a frame, 1024 officially; exactly round(1081.6) = 1082
    x, s, grid = tokens(64, 13, 13, 8, seed=5)
    assert video(x, s, grid, 0.1, exact=False).index.numel() == 1024
    out = video(x, s, grid, 0.1)
    check_contract(out, x, 0.1)
    assert out.index.numel() == 1082


def test_exact_makes_up_for_the_cap():
    # N = 10, r = 0.9, one segment of 2 frames: per frame (6, 0), (5, 5) (the cap above): 16 officially;
    # exactly 18: two more salient tokens, the most attended unkept ones (frames that keep tokens first)
    x, s, grid = tokens(2, 2, 5, 4, seed=0)
    official = video(x, s, grid, 0.9, exact=False, c=1, tau=-1.0)
    assert official.report.details["per_frame"] == [[6, 0], [5, 5]] and official.index.numel() == 16
    out = video(x, s, grid, 0.9, c=1, tau=-1.0)
    check_contract(out, x, 0.9)
    assert out.index.numel() == 18


def test_at_least_one_token():
    # int(N r) = 0: the official keeps nothing; ours the most attended token of the video
    x, s, grid = tokens(3, 2, 5, 6, seed=4)
    assert video(x, s, grid, 0.05, exact=False).index.tolist() == [int(s.reshape(-1).argmax())]


# ------------------------------------------------------------------------------------------------
# The official block (fastvid_llavavideo modeling_qwen2.py), which hard-codes 64 frames of 13 x 13

OFFICIAL_CASES = [{}, {"c": 2, "tau": 0.3, "p": 2}, {"c": 3, "tau": 0.5, "p": 1, "d": 0.7},
                  {"c": 2, "tau": 0.95, "p": 3, "beta": 0.3}, {"c": 8, "tau": 0.99}]
RUNS = [1, 3, 5, 8, 1, 2, 12, 4, 16, 7, 5]  # scenes of the test videos (64 frames)


def scenes(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features (64, 169, 8), saliency, frame features (64, 5)): runs of near-identical frames."""
    x, s, _ = tokens(64, 13, 13, 8, seed=seed, drift=0.3)
    g = torch.Generator().manual_seed(seed + 10)
    scene = torch.repeat_interleave(torch.arange(len(RUNS)), torch.tensor(RUNS))
    first = torch.cumsum(torch.tensor([0] + RUNS[:-1]), 0)[scene]
    x = x[first] + 0.01 * torch.randn(x.shape, generator=g)
    frame_features = torch.randn(len(RUNS), 5, generator=g)[scene] + 0.1 * torch.randn(64, 5, generator=g)
    return x, s, frame_features


@pytest.mark.parametrize("options", OFFICIAL_CASES)
@pytest.mark.parametrize("ratio", [0.1, 0.3])
@pytest.mark.parametrize("with_signals", [False, True])
def test_not_exact_reproduces_the_official(options, ratio, with_signals):
    official = official_or_skip("fastvid-llava-video")  # its torch.rand density noise neutralised (zeros)
    x, s, frame_features = scenes(seed=int(with_signals))
    options = {"tau": 0.9, **options}
    signals = None
    if with_signals:  # other global features and attention than the fallbacks
        attention = torch.rand(64, 169, generator=torch.Generator().manual_seed(3))
        signals = {"frame_features": frame_features, "attention": attention}
    index, features = official(x, signals["attention"] if signals else s, ratio,
                               frame_features=frame_features if signals else None, **options)
    out = video(x, s, (13, 13), ratio, exact=False, signals=signals, **options)
    assert max(out.report.details["segments"]) > 1  # multi-frame segments, several anchor frames
    assert torch.equal(out.index, index)
    torch.testing.assert_close(out.features, features)


def test_the_official_runs_on_its_shape_only():
    official = official_or_skip("fastvid-llava-video")
    x, s, _ = tokens(32, 14, 14, 4, seed=0)
    with pytest.raises(ValueError, match="64 x 169"):
        official(x, s, 0.1)


# ------------------------------------------------------------------------------------------------
# A converted LLaVA-Video checkpoint picks the path; its SigLIP head's attention is average-pooled


@pytest.fixture(scope="module")
def clip():
    from pathlib import Path

    from ottvid_cli.video import sample_frames

    return sample_frames(Path(__file__).parent / "data" / "bikes.mp4", 4)


def test_a_converted_llava_video_picks_the_llava_video_path(tiny_llava_video, tiny_llava_ov,
                                                            siglip_heads, clip):  # noqa: F811
    from transformers import SiglipVisionModel

    from ottvid_cli import pipeline
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.backbones.llava_onevision import LlavaOneVision

    backbone = load_backbone(str(tiny_llava_video), siglip_head=str(siglip_heads[0]))
    assert backbone.settings is not None and backbone.grid == (13, 13)
    assert backbone.method_defaults == {**LlavaOneVision.video_method_defaults, "visionzip": {"grid_newline": True}}
    assert Compression("visionzip").config(backbone).grid_newline is True  # grid newlines
    prepared = pipeline.prepare(backbone, clip, method="fastvid")
    assert prepared.config == FastVIDConfig(path="llava_video", tau=0.9)
    report = prepared.compressed.report
    assert report.details["path"] == "llava_video" and report.details["signals"] == "siglip_head"
    check_contract(prepared.compressed, prepared.visual.features, 0.1)
    # the head's attention, average-pooled 27 x 27 -> 13 x 13 like the features (get_attn_2dPool)
    ref = SiglipVisionModel.from_pretrained(siglip_heads[0]).eval()
    with torch.no_grad():
        pixels = prepared.inputs["pixel_values_videos"][0]
        hidden = backbone.model.model.vision_tower(pixels, output_hidden_states=True).hidden_states[-1]
        states = ref.post_layernorm(hidden)
        attention = ref.head.attention(ref.head.probe.expand(4, -1, -1), states, states)[1][:, 0]
    signals = prepared.visual.signals
    torch.testing.assert_close(signals["attention"], F.avg_pool2d(attention.view(4, 1, 27, 27), 2).view(4, 169),
                               rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(signals["frame_features"], ref.head(states), rtol=1e-4, atol=1e-5)
    # FlashVID's LLaVA-Video defaults; the user's options still win
    assert Compression("flashvid", 0.1).config(backbone) == methods.make_config(
        "flashvid", min_segments=8, selection="attn_div_v2")
    assert Compression("fastvid", 0.1, options={"path": "llava_onevision"}).config(backbone).path == "llava_onevision"
    # a LLaVA-OneVision checkpoint keeps its path
    plain = load_backbone(str(tiny_llava_ov))
    assert plain.method_defaults == {**LlavaOneVision.onevision_method_defaults, "visionzip": {"layout": "official"}}
    assert Compression("fastvid", 0.1).config(plain).path == "llava_onevision"


@pytest.mark.parametrize("bad", [{"path": "llava-video"}])
def test_bad_path(bad):
    with pytest.raises(ValueError, match="path"):
        FastVIDConfig(**bad)
