"""fastvid's LLaVA-OneVision path (docs/methods.md, "fastvid"): each step by hand, the official block on
the same tensors, and the LLaVA-OneVision adapter's SigLIP head signals through pipeline.prepare."""

import pytest
import torch
import torch.nn.functional as F

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.fastvid import FastVIDConfig, onevision_plan
from ottvid_cli.request import Compression, Request
from test_methods import check_contract, official_or_skip, tokens

OV = {"path": "llava_onevision"}


def ov(x, s, grid, ratio, **options):
    return methods.compress_with("fastvid", x, s, grid, ratio=ratio, **{**OV, **options})


# ------------------------------------------------------------------------------------------------
# Step 2: the budget and the DTM units


def test_plan_per_frame_and_units():
    # N = 36, r = 0.5: R = 18, C = int(7.2) = 7, S = 11. Segments of 1, 3, 5, 2 frames, p = 4:
    # 1 -> 7 (single-frame DTM); 3 -> 21 on its last frame; 5 -> 35 // 2 = 17 on frames 4 and 0 of
    # the segment (counted from its end); 2 -> 14 on its last frame
    salient, context, per_frame, units = onevision_plan([1, 3, 5, 2], 36, FastVIDConfig(ratio=0.5, **OV))
    assert (salient, context) == (11, 7)
    assert per_frame == [7, 0, 0, 21, 17, 0, 0, 0, 17, 0, 14]
    assert units == [(0, 1), (1, 3), (4, 5), (9, 2)]


def test_plan_anchor_frames_with_c_tokens_merge_alone():
    # R = int(30 * 0.1) = 3, C = 1: a 3-frame segment with p = 2 gets 3 // 2 = 1 = C on frames 2 and 0,
    # which the official therefore merges as single-frame segments (count == C); frame 1 keeps only
    # its salient tokens; with p = 1 every frame is such an anchor frame
    assert onevision_plan([3], 30, FastVIDConfig(ratio=0.1, p=2, **OV))[2:] == ([1, 0, 1], [(0, 1), (2, 1)])
    assert onevision_plan([3], 30, FastVIDConfig(ratio=0.1, p=1, **OV))[2:] == ([1, 1, 1], [(0, 1), (1, 1), (2, 1)])


def test_path_is_checked():
    assert FastVIDConfig().path == "qwen2_5_vl"
    with pytest.raises(ValueError, match="path"):
        FastVIDConfig(path="llava")


# ------------------------------------------------------------------------------------------------
# Steps 3-4 by hand: one frame of 8 tokens in 2-D, R = 4: 3 salient tokens and C = 1 anchor

FRAME = torch.tensor([[0.0, -5.0], [-5.0, 0.0], [-3.0, -3.0],  # salient (most attended)
                      [3.9, 0.0], [4.0, 0.0], [4.1, 0.0], [4.0, 0.1],  # a tight cluster around token 4
                      [0.0, 3.0]])  # a lone token
ATTENTION = torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_single_frame_dtm_by_hand():
    # token 4 is the density peak (its 3 nearest are 0.1 away); the only anchor, every non-salient
    # token joins it, itself included: 5 joined, w = max(1 / 6, 0.6)
    x, s = FRAME[None], ATTENTION[None]
    out = ov(x, s, (2, 4), 0.5, exact=False)
    assert out.index.tolist() == [0, 1, 2, 4]
    assert out.assignment.tolist() == [0, 1, 2, 3, 3, 3, 3, 3]
    assert torch.equal(out.features[:3], FRAME[:3])
    torch.testing.assert_close(out.features[3], 0.6 * FRAME[4] + 0.4 * FRAME[3:8].mean(0))
    # the Qwen2.5-VL path keeps the anchor out of its own pool
    qwen = methods.compress_with("fastvid", x, s, (2, 4), ratio=0.5, exact=False)
    assert qwen.index.tolist() == [0, 1, 2, 4]
    torch.testing.assert_close(qwen.features[3], 0.6 * FRAME[4] + 0.4 * FRAME[[3, 5, 6, 7]].mean(0))


def test_multi_frame_dtm_by_hand():
    # two identical frames in one segment (c = 1, tau = -1): C L // ceil(L / p) = 2 anchors, in the last
    # frame only: token 4 (the peak), then token 6 (denser than 3 and 5, 0.1 from the peak); every
    # non-salient token of both frames joins the most similar (cosine) of the two: the lone token 7
    # and token 6 join 6 (flat 14), the rest join 4 (flat 12)
    x, s = torch.stack([FRAME, FRAME]), torch.stack([ATTENTION, ATTENTION])
    out = ov(x, s, (2, 4), 0.5, exact=False, c=1, tau=-1.0)
    assert out.report.details["segments"] == [2]
    assert out.report.details["per_frame"] == [[3, 0], [3, 2]]
    assert out.index.tolist() == [0, 1, 2, 8, 9, 10, 12, 14]
    flat = x.reshape(16, 2)
    torch.testing.assert_close(out.features[6], 0.6 * flat[12] + 0.4 * flat[[3, 4, 5, 11, 12, 13]].mean(0))
    torch.testing.assert_close(out.features[7], 0.6 * flat[14] + 0.4 * flat[[6, 7, 14, 15]].mean(0))
    # frame 0's tokens are represented by the anchor they join in frame 1, the nearest anchor frame
    assert out.assignment.tolist() == [0, 1, 2, 6, 6, 6, 7, 7, 3, 4, 5, 6, 6, 6, 7, 7]
    check_contract(out, x, 0.5, exact=False)


def test_anchor_count_is_capped_at_the_free_tokens():
    # N = 10, r = 0.9: S = 6, C = 3; a 2-frame segment's last frame would get 6 anchors of 4 free
    # tokens (the official's topk fails): ours takes the 4
    x, s, grid = tokens(2, 2, 5, 4, seed=0)
    out = ov(x, s, grid, 0.9, exact=False, c=1, tau=-1.0)
    assert out.report.details["per_frame"] == [[6, 0], [6, 4]]
    assert out.index.numel() == 16


# ------------------------------------------------------------------------------------------------
# Signals: DySeg on frame_features, ATS on attention


def test_signals_drive_dyseg_and_ats():
    x, s, grid = tokens(4, 2, 5, 6, seed=1, drift=0.01)  # near-identical frames
    frame_features = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.1]])
    attention = torch.rand(4, 10, generator=torch.Generator().manual_seed(2))
    signals = {"frame_features": frame_features, "attention": attention, "source": "siglip_head"}
    out = ov(x, s, grid, 0.5, exact=False, c=2, signals=signals)
    assert out.report.details["segments"] == [2, 2]  # the one forced cut: after the least similar pair
    assert out.report.details["signals"] == "siglip_head"
    kept = torch.zeros(40, dtype=torch.bool)
    kept[out.index] = True
    salient = attention.argsort(-1, descending=True)[:, :3]  # R = 5, C = 2, S = 3
    assert bool(kept.view(4, 10).gather(1, salient).all())
    fallback = ov(x, s, grid, 0.5, exact=False, c=2)
    assert fallback.report.details["signals"] == "fallback"
    assert ov(x, s, grid, 0.5, exact=False, c=2, signals={"attention": attention}).report.details["signals"] \
        == "signals: attention only"


@pytest.mark.parametrize("bad", [{"attention": torch.zeros(4, 9)}, {"frame_features": torch.zeros(3, 5)},
                                 {"attention": torch.full((4, 10), float("nan"))}])
def test_bad_signals_are_refused(bad):
    x, s, grid = tokens(4, 2, 5, 6, seed=1)
    with pytest.raises(ValueError, match="signals"):
        ov(x, s, grid, 0.5, signals=bad)


# ------------------------------------------------------------------------------------------------
# Counts


def test_exact_adds_salient_tokens_frame_by_frame():
    # N = 10, r = 0.25: R = 2, C = 0, S = 2, officially 8 tokens; exactly round(0.25 * 40) = 10: one more
    # salient token in the frames whose third best token scores best (frames 3 and 1)
    x, _, grid = tokens(4, 2, 5, 6, seed=3)
    s = torch.zeros(4, 10)
    s[:, 0], s[:, 1] = 0.9, 0.8
    s[:, 2] = torch.tensor([0.1, 0.5, 0.2, 0.6])
    assert ov(x, s, grid, 0.25, exact=False).index.numel() == 8
    out = ov(x, s, grid, 0.25)
    check_contract(out, x, 0.25)
    assert [a for a, _ in out.report.details["per_frame"]] == [2, 3, 2, 3]
    assert out.index.tolist() == [0, 1, 10, 11, 12, 20, 21, 30, 31, 32]


def test_at_least_one_token():
    # int(N r) = 0: the official keeps nothing; ours the most salient token of the video
    x, s, grid = tokens(3, 2, 5, 6, seed=4)
    out = ov(x, s, grid, 0.05, exact=False)
    assert out.index.tolist() == [int(s.reshape(-1).argmax())]


def test_paper_shape_counts():
    # 32 x 196, r = 0.1: R = 19, C = 7, S = 12; 8 segments of 4 frames (from the global features), p = 4:
    # 28 anchors on each segment's last frame: 32 * 12 + 8 * 28 = 608 officially, 627 exactly
    x, s, grid = tokens(32, 14, 14, 8, seed=5)
    signals = {"frame_features": torch.eye(8).repeat_interleave(4, 0)}
    official = ov(x, s, grid, 0.1, exact=False, signals=signals)
    assert official.report.details["segments"] == [4] * 8
    assert official.index.numel() == 608
    out = ov(x, s, grid, 0.1, signals=signals)
    check_contract(out, x, 0.1)
    assert out.index.numel() == 627  # round(0.1 * 32 * 196)


# ------------------------------------------------------------------------------------------------
# The official block (fastvid_llavaonevision modeling_qwen2.py) on the same tensors

OFFICIAL_CASES = [{}, {"tau": 0.9}, {"c": 2, "tau": 0.3, "p": 2}, {"c": 3, "tau": 0.5, "p": 2},
                  {"c": 3, "tau": 0.5, "p": 1, "d": 0.7}, {"c": 2, "tau": 0.95, "p": 3, "beta": 0.3}]


@pytest.mark.parametrize("options", OFFICIAL_CASES)
@pytest.mark.parametrize("ratio", [0.1, 0.3])
@pytest.mark.parametrize("with_signals", [False, True])
def test_not_exact_reproduces_the_official(options, ratio, with_signals):
    official = official_or_skip("fastvid-ov")  # its torch.rand density noise neutralised (zeros)
    for seed in range(2):
        x, s, grid = tokens(18, 6, 6, 12, seed=seed, drift=0.2)
        repeat = torch.arange(18)
        repeat[5:9], repeat[14:16] = 5, 14  # runs of near-identical frames
        x = x[repeat] + 0.001 * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
        signals = None
        if with_signals:  # other global features and attention than the fallbacks
            g = torch.Generator().manual_seed(seed + 10)
            signals = {"frame_features": x.mean(1)[:, :5] + 0.1 * torch.randn(18, 5, generator=g),
                       "attention": torch.rand(18, 36, generator=g)}
        index, features = official(x, signals["attention"] if signals else s, ratio,
                                   frame_features=signals["frame_features"] if signals else None, **options)
        out = ov(x, s, grid, ratio, exact=False, signals=signals, **options)
        assert torch.equal(out.index, index)
        torch.testing.assert_close(out.features, features)


# ------------------------------------------------------------------------------------------------
# The LLaVA-OneVision adapter: SigLIP head signals, the backbone's defaults, the fallback


@pytest.fixture(scope="module")
def siglip_heads(tmp_path_factory):
    """(a tiny SigLIP vision checkpoint with its attention-pooling head, as wide as the tiny LLaVA-OneVision's
    tower; one without a head)."""
    from tests.support.tiny_models import build_tiny_siglip_head

    folder = tmp_path_factory.mktemp("siglip-heads")
    return build_tiny_siglip_head(folder / "head"), build_tiny_siglip_head(folder / "no-head", use_head=False)


@pytest.fixture(scope="module")
def clip():
    from pathlib import Path

    from ottvid_cli.video import sample_frames

    return sample_frames(Path(__file__).parent / "data" / "cockatoo.mp4", 4)


@pytest.fixture(scope="module")
def with_head(tiny_llava_ov, siglip_heads):
    from ottvid_cli.backbones import load_backbone

    return load_backbone(str(tiny_llava_ov), siglip_head=str(siglip_heads[0]))


def test_prepare_uses_the_onevision_path_and_the_head(with_head, siglip_heads, clip):
    from transformers import SiglipVisionModel

    from ottvid_cli import pipeline

    prepared = pipeline.prepare(with_head, clip, method="fastvid")
    assert prepared.config.path == "llava_onevision" and prepared.config.tau == 0.9
    report = prepared.compressed.report
    assert report.details["path"] == "llava_onevision" and report.details["signals"] == "siglip_head"
    visual = prepared.visual
    # the signals, computed directly: the tower's last hidden state -> post_layernorm -> the head
    ref = SiglipVisionModel.from_pretrained(siglip_heads[0]).eval()
    pixels = prepared.inputs["pixel_values_videos"][0]
    with torch.no_grad():
        hidden = with_head.model.model.vision_tower(pixels, output_hidden_states=True).hidden_states[-1]
        states = ref.post_layernorm(hidden)
        pooled = ref.head(states)
        probe = ref.head.probe.expand(4, -1, -1)
        attention = ref.head.attention(probe, states, states)[1][:, 0]  # (T, 729), averaged over heads
    grid_attention = F.interpolate(attention.view(4, 1, 27, 27), size=[14, 14], mode="bilinear").view(4, 196)
    torch.testing.assert_close(visual.signals["frame_features"], pooled, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(visual.signals["attention"], grid_attention, rtol=1e-4, atol=1e-7)
    assert visual.signals["source"] == "siglip_head"
    # what prepare compressed is the method on those signals
    direct = methods.compress_with("fastvid", visual.features, visual.saliency, visual.grid, ratio=0.1,
                                   signals=visual.signals, path="llava_onevision", tau=0.9)
    assert torch.equal(prepared.compressed.index, direct.index)
    assert torch.equal(prepared.compressed.features, direct.features)
    check_contract(prepared.compressed, visual.features, 0.1)


def test_user_options_win_over_the_backbone_defaults(with_head, clip):
    from ottvid_cli import pipeline

    config = Compression("fastvid", 0.1, options={"path": "qwen2_5_vl"}).config(with_head)
    assert config.path == "qwen2_5_vl" and config.tau == 0.9  # the backbone's other default stays
    assert Compression("fastvid", 0.2, options={"tau": 0.5}).config(with_head) == FastVIDConfig(
        ratio=0.2, tau=0.5, path="llava_onevision")
    prepared = pipeline.prepare(with_head, clip, method="fastvid", config=config)
    assert prepared.compressed.report.details["path"] == "qwen2_5_vl"
    assert prepared.recompress(method="fastvid").config.path == "llava_onevision"  # defaults again
    # methods without a LLaVA-OneVision path keep their defaults; Qwen adapters carry none
    assert Compression("holitom", 0.1).config(with_head) == methods.make_config("holitom")
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    from ottvid_cli.backbones.qwen3_vl import Qwen3VL

    assert Qwen25VL.method_defaults == {} and Qwen3VL.method_defaults == {}


def test_without_a_head_fastvid_falls_back(tiny_llava_ov, clip):
    from ottvid_cli import pipeline
    from ottvid_cli.backbones import load_backbone

    backbone = load_backbone(str(tiny_llava_ov))
    prepared = pipeline.prepare(backbone, clip, method="fastvid")
    assert prepared.visual.signals == {}
    assert prepared.config.path == "llava_onevision"
    assert prepared.compressed.report.details["signals"] == "fallback"
    visual = prepared.visual
    direct = methods.compress_with("fastvid", visual.features, visual.saliency, visual.grid, ratio=0.1,
                                   path="llava_onevision", tau=0.9)
    assert torch.equal(prepared.compressed.index, direct.index)


def test_a_checkpoint_without_a_head_is_refused(tiny_llava_ov, siglip_heads, tiny_qwen):
    from ottvid_cli.backbones import ModelError, load_backbone

    with pytest.raises(ModelError, match="no SigLIP attention-pooling head"):
        load_backbone(str(tiny_llava_ov), siglip_head=str(siglip_heads[1]))
    with pytest.raises(ModelError, match="LLaVA-OneVision"):
        load_backbone(str(tiny_qwen), siglip_head=str(siglip_heads[0]))


def test_the_signals_come_back_from_the_disk_cache(with_head, tmp_path):
    from pathlib import Path

    from ottvid_cli.cache import video_key
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    video, sampling = Path(__file__).parent / "data" / "cockatoo.mp4", Sampling(frames=4)
    assert video_key(with_head, video, sampling)["siglip_head"] == with_head.siglip_head_name
    first = Engine(with_head, cache_dir=tmp_path).ask(video, "What happens?",
                                                      Request(sampling, Compression("fastvid"), max_new_tokens=2))
    loaded = Engine(with_head, cache_dir=tmp_path).ask(video, "What happens?",
                                                       Request(sampling, Compression("fastvid"), max_new_tokens=2))
    assert loaded.cache_hit and loaded.compression["details"]["signals"] == "siglip_head"
    for name in ("frame_features", "attention"):
        assert torch.equal(loaded.prepared.visual.signals[name].cpu(), first.prepared.visual.signals[name].cpu())
    assert torch.equal(loaded.compressed.index, first.compressed.index)
