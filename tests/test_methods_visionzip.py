"""visionzip: dominant + contextual tokens per frame, bug_compatible, the official layout, against the HoliTom
video code."""

import pathlib

import pytest
import torch

from ottvid_cli.compression import methods
from ottvid_cli.request import Compression
from test_methods import check_contract, official_or_skip, tokens

# one frame of 8 tokens (grid 2 x 4): tokens 1 and 6 are the most salient; 0 and 4 become targets;
# 2 and 3 point like 0, 5 and 7 like 4
X = torch.tensor([[1.0, 0.0], [5.0, 5.0], [1.0, 0.1], [2.0, 0.5], [0.0, 1.0], [0.1, 1.0], [-1.0, -1.0],
                  [0.2, 3.0]])[None]
S = torch.tensor([[0.1, 0.9, 0.2, 0.1, 0.3, 0.2, 0.8, 0.1]])
OPTIONS = {"exact": False, "tokens_per_frame": 4, "dominant_ratio": 0.5}  # d = 2, c = 2


def test_dominant_and_contextual_tokens_by_hand():
    # non-dominant list [0, 2, 3, 4, 5, 7], stride 6 // 2 = 3: targets at slots 0 and 3 = tokens 0, 4
    out = methods.compress_with("visionzip", X, S, (2, 4), **OPTIONS)
    assert out.index.tolist() == [0, 1, 4, 6]
    assert out.assignment.tolist() == [0, 1, 0, 0, 2, 2, 3, 2]
    x = X[0]
    expected = torch.stack([x[[0, 2, 3]].mean(0), x[1], x[[4, 5, 7]].mean(0), x[6]])
    torch.testing.assert_close(out.features, expected)
    assert torch.equal(out.features[[1, 3]], x[[1, 6]])  # dominant tokens bit-identical


def test_bug_compatible_contextual_is_target_plus_mean():
    out = methods.compress_with("visionzip", X, S, (2, 4), bug_compatible=True, **OPTIONS)
    x = X[0]
    torch.testing.assert_close(out.features[0], x[0] + x[[2, 3]].mean(0))
    torch.testing.assert_close(out.features[2], x[4] + x[[5, 7]].mean(0))


def test_targets_are_a_floored_stride():
    # 7 non-dominant tokens, 3 targets: stride 7 // 3 = 2, targets at slots 0, 2, 4 (the tail has none)
    x = torch.randn(1, 7, 3)
    out = methods.compress_with("visionzip", x, torch.zeros(1, 7), (1, 7), exact=False, tokens_per_frame=3,
                                dominant_ratio=0.0)
    assert out.index.tolist() == [0, 2, 4]


def test_grid_newline_scramble_only_when_bug_compatible():
    # d = int(3 * 0.7) = 2 dominant tokens: 3 (most salient) then 1; target 0 absorbs token 2
    x = torch.randn(1, 4, 3)
    s = torch.tensor([[0.0, 0.5, 0.1, 0.9]])
    common = {"exact": False, "tokens_per_frame": 3, "dominant_ratio": 0.7, "grid_newline": True}
    plain = methods.compress_with("visionzip", x, s, (2, 2), **common)
    assert plain.index.tolist() == [0, 1, 3]
    assert torch.equal(plain.features[1:], x[0, [1, 3]])
    buggy = methods.compress_with("visionzip", x, s, (2, 2), bug_compatible=True, **common)
    assert torch.equal(buggy.features[1:], x[0, [3, 1]])  # position 1 carries token 3's features
    torch.testing.assert_close(buggy.features[0], x[0, 0] + x[0, 2])


def test_exact_split_over_frames():
    x, s, grid = tokens(3, 4, 4, 6, seed=4)
    out = methods.compress_with("visionzip", x, s, grid, ratio=0.3)  # M = 14: 5, 5, 4
    check_contract(out, x, 0.3)
    assert sorted(out.report.details["per_frame"]) == [4, 5, 5]


@pytest.mark.parametrize("bad", [{"tokens_per_frame": 5}, {"dominant_ratio": 1.5}, {"bug_compatible": True},
                                 {"exact": False, "tokens_per_frame": 0}])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        methods.make_config("visionzip", **bad)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5])
def test_bug_compatible_grid_reproduces_the_official(ratio):
    official = official_or_skip("visionzip")
    for seed in range(3):
        x, s, grid = tokens(4, 8, 8, 12, seed=seed)
        expected = official(x, s, ratio, grid_newline=True)
        out = methods.compress_with("visionzip", x, s, grid, ratio=ratio, exact=False, bug_compatible=True,
                                    grid_newline=True)
        torch.testing.assert_close(out.features, expected)


def test_bug_compatible_one_token_reproduces_the_official_rows():
    """The one_token layout (LLaVA-OneVision) orders dominant before contextual tokens; same rows."""
    official = official_or_skip("visionzip")
    x, s, grid = tokens(4, 14, 14, 12, seed=7)
    expected = official(x, s, 0.1, tokens_per_frame=20)
    out = methods.compress_with("visionzip", x, s, grid, ratio=0.1, exact=False, bug_compatible=True,
                                tokens_per_frame=20)
    assert out.features.shape[0] == 4 * 20
    key = lambda rows: rows[torch.argsort(rows[:, 0])]  # noqa: E731
    torch.testing.assert_close(key(out.features), key(expected))


# ---------------------------------------------------------------------------------------------
# layout="official": Compressed.order, the sequence in which the official one_token path feeds rows
# ---------------------------------------------------------------------------------------------

def test_official_layout_by_hand():
    # the frame of the hand-made case twice (frame 1 with reversed saliency): index [0, 1, 4, 6] in frame 0,
    # rows 0-3; the official sequence per frame is the dominant tokens in position order, then the
    # contextual ones (the targets) in position order
    x = torch.cat([X, X])
    s = torch.cat([S, S.flip(-1)])  # frame 1: tokens 6 and 1 are the most salient (positions 1, 6)
    plain = methods.compress_with("visionzip", x, s, (2, 4), **OPTIONS)
    out = methods.compress_with("visionzip", x, s, (2, 4), layout="official", **OPTIONS)
    assert plain.order is None and torch.equal(plain.sequence(), torch.arange(plain.index.numel()))
    # rows, position order: frame 0 -> 0:[0] 1:[1] 2:[4] 3:[6]; frame 1 (non-dominant list [0, 2, 3, 4, 5, 7],
    # stride 3: targets 0 and 4) -> 4:[8] 5:[9] 6:[12] 7:[14]
    assert out.index.tolist() == [0, 1, 4, 6, 8, 9, 12, 14]
    assert out.order.tolist() == [1, 3, 0, 2, 5, 7, 4, 6]
    assert out.index[out.order].tolist() == [1, 6, 0, 4, 9, 14, 8, 12]
    # everything else is the position layout's: rows, index, assignment, the merge map
    assert torch.equal(out.features, plain.features) and torch.equal(out.assignment, plain.assignment)
    assert torch.equal(out.apply(x.reshape(16, -1)), plain.apply(x.reshape(16, -1)))  # index order
    assert out.report.config["layout"] == "official"


@pytest.mark.parametrize("options", [{}, {"exact": False}, {"ratio": 0.3}, {"ratio": 1.0}, {"dominant_ratio": 0.0},
                                     {"dominant_ratio": 1.0}, {"exact": False, "bug_compatible": True}])
def test_official_layout_is_a_permutation_grouped_by_frame(options):
    x, s, grid = tokens(5, 4, 4, 6, seed=3)
    options = {"ratio": 0.2, **options}
    out = methods.compress_with("visionzip", x, s, grid, layout="official", **options)
    check_contract(out, x, options["ratio"], exact=options.get("exact", True))
    m = out.index.numel()
    assert out.order.dtype == torch.long and torch.equal(out.order.sort().values, torch.arange(m))
    frame = out.index[out.order] // 16
    assert torch.all(frame[1:] >= frame[:-1])  # frame by frame
    # within a frame: dominant (the most salient, d = int(k * dominant_ratio)) first, each part ascending
    counts = torch.bincount(out.index // 16, minlength=5)
    sequence = out.index[out.order]
    for t in range(5):
        here = sequence[frame == t] % 16
        d = int(int(counts[t]) * out.report.config["dominant_ratio"])
        top = torch.sort(s[t], descending=True, stable=True).indices[:d]
        assert set(here[:d].tolist()) == set(top.tolist())
        assert torch.all(here[:d].diff() > 0) and torch.all(here[d:].diff() > 0)


def test_official_layout_with_grid_newline_is_the_position_order():
    x, s, grid = tokens(3, 4, 4, 6, seed=1)
    out = methods.compress_with("visionzip", x, s, grid, layout="official", grid_newline=True, exact=False,
                                bug_compatible=True)
    assert out.order is None  # the official grid path sorts by position


def test_bad_layout():
    with pytest.raises(ValueError, match="layout"):
        methods.make_config("visionzip", layout="dominant")


def test_dominant_ratio_one_drops_the_rest():
    # no contextual target: every non-dominant token is dropped (the official divides by zero there)
    x, s, grid = tokens(2, 4, 4, 6, seed=2)
    out = methods.compress_with("visionzip", x, s, grid, ratio=0.25, dominant_ratio=1.0)
    check_contract(out, x, 0.25)
    assert int((out.assignment >= 0).sum()) == out.index.numel()


@pytest.mark.parametrize("tokens_per_frame", [20, 7])
def test_official_layout_gives_the_official_sequence(tokens_per_frame):
    """HoliTom's visionzip (one_token) on the same tensors returns, frame by frame, the dominant then the
    contextual tokens: our rows taken in `order` are that sequence (bug_compatible: the same arithmetic)."""
    official = official_or_skip("visionzip")
    for seed in range(3):
        x, s, grid = tokens(4, 14, 14, 12, seed=seed)
        expected = official(x, s, 0.1, tokens_per_frame=tokens_per_frame)
        out = methods.compress_with("visionzip", x, s, grid, ratio=0.1, exact=False, bug_compatible=True,
                                    tokens_per_frame=tokens_per_frame, layout="official")
        torch.testing.assert_close(out.features[out.order], expected, rtol=0, atol=0)


def test_llava_onevision_receives_the_rows_in_the_official_order(tiny_llava_ov):
    """pipeline.prepare with visionzip layout="official" on the tiny LLaVA-OneVision: the adapter's
    `llm_inputs` places the rows at the video slots in `order`, then the newline; the default layout
    places them in position order; prefix reuse tells the two apart."""
    from ottvid_cli import pipeline
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.backbones.base import _same, _visual_key
    from ottvid_cli.compression.methods.visionzip import VisionZipConfig
    from ottvid_cli.video import sample_frames

    backbone = load_backbone(str(tiny_llava_ov))
    clip = sample_frames(pathlib.Path(__file__).parent / "data" / "cockatoo.mp4", 4)
    official = pipeline.prepare(backbone, clip, method="visionzip",
                                config=VisionZipConfig(ratio=0.1, layout="official"))
    plain = pipeline.prepare(backbone, clip, method="visionzip", config=VisionZipConfig(ratio=0.1))
    c = official.compressed
    assert c.order is not None and not torch.equal(c.order, torch.arange(c.index.numel()))
    assert torch.equal(c.features, plain.compressed.features) and torch.equal(c.index, plain.compressed.index)
    placed = {}
    for name, p in (("official", official), ("plain", plain)):
        llm = backbone.llm_inputs(p.inputs, p.features, p.kept, compressed=p.compressed)
        placed[name] = llm["mm_encoder_outputs"]["video"].pooler_output[0]
        video = int((llm["input_ids"][0] == backbone.video_token_id).sum())
        assert video == placed[name].shape[0] == c.index.numel() + 1  # the kept tokens and the newline
    dtype = backbone.model.dtype
    assert torch.equal(placed["official"][:-1], c.features[c.order].to(dtype))
    assert torch.equal(placed["plain"][:-1], c.features.to(dtype))
    torch.testing.assert_close(placed["official"][-1], backbone.model.model.image_newline)
    # the embeddings the LLM gets: the video slots hold the rows in the official order
    embedded = {}
    for name, p in (("official", official), ("plain", plain)):
        llm = backbone.llm_inputs(p.inputs, p.features, p.kept, compressed=p.compressed)
        captured = {}
        hook = backbone.model.model.language_model.register_forward_pre_hook(
            lambda module, args, kwargs: captured.update(embeds=kwargs.get("inputs_embeds")), with_kwargs=True)
        try:
            backbone.model(**llm)
        finally:
            hook.remove()
        slots = (llm["input_ids"][0] == backbone.video_token_id).nonzero().flatten()
        embedded[name] = captured["embeds"][0, slots]
    assert torch.equal(embedded["official"][:-1], c.features[c.order].to(dtype))
    assert torch.equal(embedded["plain"][:-1], c.features.to(dtype))
    key_official = _visual_key(official.features, official.kept, official.compressed)
    key_plain = _visual_key(plain.features, plain.kept, plain.compressed)
    assert not all(_same(a, b) for a, b in zip(key_official, key_plain))  # a prefix of one layout is not the other's


def test_m_rope_backbones_refuse_an_order():
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    from ottvid_cli.backbones.qwen3_vl import Qwen3VL

    x, s, grid = tokens(2, 4, 4, 6, seed=0)
    out = methods.compress_with("visionzip", x, s, grid, layout="official")
    for adapter in (Qwen25VL, Qwen3VL):
        with pytest.raises(ValueError, match="order"):
            adapter.llm_inputs(None, {}, out.features, out.index, compressed=out)


def test_llava_onevision_selects_the_official_layout_by_default(tiny_llava_ov, tiny_qwen):
    """The adapters' method_defaults: LLaVA-OneVision (one_token newline) feeds VisionZip's rows in the
    official sequence unless the user asks for position order; Qwen2.5-VL keeps position order."""
    from ottvid_cli import pipeline
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.video import sample_frames

    clip = sample_frames(pathlib.Path(__file__).parent / "data" / "cockatoo.mp4", 4)
    backbone = load_backbone(str(tiny_llava_ov))
    default = pipeline.prepare(backbone, clip, method="visionzip")
    assert default.config.layout == "official" and default.compressed.order is not None
    config = Compression("visionzip", options={"layout": "position"}).config(backbone)
    assert config.layout == "position" and pipeline.prepare(backbone, clip, method="visionzip",
                                                            config=config).compressed.order is None
    qwen = load_backbone(str(tiny_qwen))
    assert Compression("visionzip").config(qwen).layout == "position"
