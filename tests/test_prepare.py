"""The one preparation path: prepare() -> Prepared, recompress without re-encoding, Sampling."""

from pathlib import Path

import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.compression import OTTVidConfig
from ottvid_cli.request import Compression, Request
from ottvid_cli.sampling import Sampling
from ottvid_cli.session import Engine

DATA = Path(__file__).parent / "data"


def test_recompress_reuses_the_encoder_output(backbone, monkeypatch):
    prepared = pipeline.prepare(backbone, DATA / "bikes.mp4", Sampling(frames=8), "ottvid", OTTVidConfig(ratio=0.5))
    assert prepared.kept.numel() == round(0.5 * prepared.visual.count)
    calls = []
    monkeypatch.setattr(type(backbone), "encode", lambda *a, **k: calls.append(1))
    smaller = prepared.recompress(OTTVidConfig(ratio=0.1))
    none = prepared.recompress(method="none")
    assert not calls  # no second encoding
    monkeypatch.undo()
    fresh = pipeline.prepare(backbone, DATA / "bikes.mp4", Sampling(frames=8), "ottvid", OTTVidConfig(ratio=0.1))
    assert torch.equal(smaller.kept, fresh.kept) and torch.equal(smaller.features, fresh.features)
    assert none.compressed is None and none.ratio == 1.0 and none.kept.numel() == prepared.visual.count
    assert prepared.config.ratio == 0.5  # the original is unchanged
    assert smaller.frames == prepared.frames and smaller.timings_ms["vision"] == prepared.timings_ms["vision"]


def test_other_registered_methods_and_default_configs(backbone):
    from ottvid_cli.compression import methods

    prepared = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4), "none", saliency=True)
    assert prepared.recompress().config == OTTVidConfig()  # the paper's defaults
    other = next((name for name in methods.names() if name not in ("ottvid", "none")), None)
    if other is not None:
        result = prepared.recompress(method=other)
        groups, tokens = prepared.visual.features.shape[:2]
        assert result.method == other and result.kept.numel() == methods.target_count(0.1, groups, tokens)
        assert set(result.tokens(100)) >= {"visual_before", "visual_after", "merges"}
    with pytest.raises(ValueError, match="unknown method 'nonsense'"):
        prepared.recompress(method="nonsense")


def test_prepare_without_saliency_cannot_recompress(backbone):
    plain = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4), "none")
    assert plain.visual.saliency is None and plain.timings_ms["compression"] is None
    with pytest.raises(ValueError, match="saliency"):
        plain.recompress(OTTVidConfig(ratio=0.2))
    kept = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4), "none", saliency=True)
    assert kept.recompress(OTTVidConfig(ratio=0.2)).compressed is not None


def test_prepare_takes_a_decoded_clip_and_ask_matches(backbone):
    clip = Sampling(frames=4).decode(DATA / "yoga.mp4", backbone.default_frames)
    prepared = pipeline.prepare(backbone, clip, Sampling(frames=4))
    assert prepared.clip is clip and prepared.timings_ms["decode"] is None
    a = Engine(backbone).ask(clip, "What?", Request(Sampling(frames=4), max_new_tokens=3))
    b = Engine(backbone).ask(DATA / "yoga.mp4", "What?", Request(Sampling(frames=4), max_new_tokens=3))
    assert a.answer == b.answer and a.tokens == b.tokens


def test_max_pixels_is_a_sampling_setting(backbone):
    small = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4, max_pixels=56 * 56))
    default = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4))
    assert small.visual.count < default.visual.count and backbone.max_pixels == default.backbone.max_pixels


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"frames": 4, "fps": 2.0}, "not both"),
        ({"frames": 0}, "frames must be >= 1"),
        ({"fps": 0.0}, "fps must be > 0"),
        ({"frames": 4, "max_frames": 2}, "give fps too"),
        ({"fps": 2.0, "max_frames": 0}, "max_frames must be >= 1"),
    ],
)
def test_sampling_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


def test_grounding_default_caps_at_768():
    assert Sampling.grounding() == Sampling(fps=2.0, max_frames=768)


def test_compression_config_presets():
    class Llava:
        official_overrides = {"k_rounding": "round"}

    assert Compression(ratio=0.2).config() == OTTVidConfig(ratio=0.2)
    assert Compression(ratio=0.2, preset="official").config(Llava()) == OTTVidConfig.official(ratio=0.2,
                                                                                                k_rounding="round")
    custom = OTTVidConfig(ratio=0.3, gamma=0.5)
    assert Compression.of(custom).config() is custom
    with pytest.raises(ValueError):
        Compression(ratio=0.1, preset="fast").config()
