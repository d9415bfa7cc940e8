"""fastvid's Qwen2.5-VL path: DySeg, the STPrune plan, density anchors, DTM merging; against the official
Qwen2.5-VL code (the LLaVA-OneVision path: test_fastvid_onevision.py)."""

import math

import pytest
import torch

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.fastvid import FastVIDConfig, density_anchors, groups_of, segment_plan, segments
from test_methods import check_contract, official_or_skip, tokens


def test_dyseg_forced_and_threshold_cuts():
    sim = torch.tensor([0.99, 0.5, 0.97, 0.9, 0.2])
    assert segments(sim, c=2, tau=0.6) == [2, 3, 1]  # cuts after pairs 1 (< tau) and 4 (least similar)
    assert segments(sim, c=3, tau=0.0) == [2, 3, 1]  # the two least similar pairs
    assert segments(sim[:2], c=8, tau=0.0) == [1, 1, 1]  # fewer frames than c: every pair is cut
    assert segments(sim[:0], c=8, tau=0.84) == [1]  # one frame


def test_groups_of_near_identical_frames():
    assert groups_of([0.96, 0.5, 0.99, 0.97], 0.95) == [2, 3]
    assert groups_of([], 0.95) == [1]


def test_plan_only_a_groups_last_frame_keeps_tokens():
    cfg = FastVIDConfig()
    # budget 50 over groups [2, 3]: 20 contextual, 30 salient = 15 + 15; one anchor group, the last
    assert segment_plan(50, [0.96, 0.5, 0.99, 0.97], 64, cfg) == [(0, 0), (15, 0), (0, 0), (0, 0), (15, 20)]


def test_plan_anchor_groups_count_from_the_end():
    cfg = FastVIDConfig()
    # 5 groups, p = 4: anchors at groups 4 and 0 (counted from the end); 11 contextual = 6 + 5, the
    # larger share to the last group; 17 salient = 4, 4, 3, 3, 3
    plan = segment_plan(28, [0.5] * 4, 64, cfg)
    assert plan == [(4, 5), (4, 0), (3, 0), (3, 0), (3, 6)]


def test_plan_caps_lose_budget():
    # 8 near-identical frames, budget 256 of N = 64: contextual min(102, 32), salient min(154, 64 - 32)
    assert segment_plan(256, [0.99] * 7, 64, FastVIDConfig())[-1] == (32, 32)
    assert sum(a + b for a, b in segment_plan(256, [0.99] * 7, 64, FastVIDConfig())) == 64


def reference_anchors(x, free, count):
    """Density peaks by loops over tokens (the official formulas on the free tokens only)."""
    idx = free.nonzero().squeeze(1).tolist()
    d = x.shape[-1]
    dist = {(i, j): float((x[i] - x[j]).norm()) / math.sqrt(d) for i in idx for j in idx}
    density = {i: math.exp(-sum(v * v for v in sorted(dist[i, j] for j in idx)[:4]) / min(4, len(idx))) for i in idx}
    dist_max = max(dist.values())
    score = {}
    for i in idx:
        higher = [dist[i, j] for j in idx if density[j] > density[i]]
        score[i] = (min(higher) if higher else dist_max) * density[i]
    return sorted(sorted(idx, key=lambda i: -score[i])[:count])


@pytest.mark.parametrize("seed", range(4))
def test_density_anchors_match_a_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 12, 3, generator=g)
    free = torch.rand(2, 12, generator=g) > 0.3
    counts = torch.tensor([3, 2])
    got = density_anchors(x, free, counts)
    for f in range(2):
        assert got[f].nonzero().squeeze(1).tolist() == reference_anchors(x[f], free[f], int(counts[f]))


def test_merge_by_hand():
    # one frame, N = 4, ratio 0.5: int(4 * 0.5) = 2 tokens, 1 contextual + 1 salient (token 0).
    # Among 1, 2, 3 the densest, token 2, is the anchor; 1 and 3 join it with weight 0.6 on the anchor
    x = torch.tensor([[[0.0, 7.0], [1.0, 0.0], [1.1, 0.0], [5.0, 0.0]]])
    s = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = methods.compress_with("fastvid", x, s, (2, 2), ratio=0.5, exact=False)
    assert out.index.tolist() == [0, 2]
    assert out.assignment.tolist() == [0, 1, 1, 1]
    assert torch.equal(out.features[0], x[0, 0])
    torch.testing.assert_close(out.features[1], 0.6 * x[0, 2] + 0.4 * x[0, [1, 3]].mean(0))


def test_counts_official_and_exact():
    x, s, grid = tokens(16, 16, 16, 8, seed=0)
    assert methods.compress_with("fastvid", x, s, grid, ratio=0.1, exact=False).features.shape[0] == 400
    out = methods.compress_with("fastvid", x, s, grid, ratio=0.1)
    check_contract(out, x, 0.1)


def test_exact_makes_up_for_the_caps():
    # 16 identical frames: 7 forced cuts (ties to the earliest pairs) leave segments of 1 x 7 and 9;
    # the 9-frame segment is one group, its budget 72 capped at one frame's 16 tokens
    x = torch.randn(1, 16, 6).expand(16, 16, 6).contiguous()
    s = torch.rand(16, 16)
    official = methods.compress_with("fastvid", x, s, (4, 4), ratio=0.5, exact=False)
    assert official.report.details["segments"] == [1] * 7 + [9]
    assert official.features.shape[0] == 7 * 8 + 16
    out = methods.compress_with("fastvid", x, s, (4, 4), ratio=0.5)
    check_contract(out, x, 0.5)
    assert out.features.shape[0] == 128


def test_unkept_tokens_belong_to_the_nearest_anchor_frame():
    # one segment (no cuts), every frame its own group (ignore > 1), p = 2: anchor frames 7, 5, 3, 1
    x, s, grid = tokens(8, 4, 4, 6, seed=1, drift=0.05)
    out = methods.compress_with("fastvid", x, s, grid, ratio=0.25, c=1, tau=-1.0, ignore=1.1, p=2)
    check_contract(out, x, 0.25)
    assert [a for _, a in out.report.details["per_frame"]] == [0, 3, 0, 3, 0, 3, 0, 3]
    dropped = torch.ones(128, dtype=torch.bool)
    dropped[out.index] = False
    for token in dropped.nonzero().squeeze(1).tolist():
        frame = token // 16
        joined = int(out.index[out.assignment[token]])
        assert joined // 16 == (frame if frame % 2 else frame + 1)  # nearest, the later on ties


OFFICIAL_CASES = [{}, {"c": 2, "tau": 0.3, "ignore": 0.999, "p": 2}, {"c": 3, "tau": 0.3, "ignore": 0.99999},
                  {"c": 2, "tau": 0.1, "ignore": 0.9999, "p": 1, "d": 0.7}]


@pytest.mark.parametrize("options", OFFICIAL_CASES)
@pytest.mark.parametrize("ratio", [0.1, 0.3])
def test_not_exact_reproduces_the_official(options, ratio):
    official = official_or_skip("fastvid")
    for seed in range(2):
        x, s, grid = tokens(18, 6, 6, 12, seed=seed, drift=0.2)
        repeat = torch.arange(18)
        repeat[5:9], repeat[14:16] = 5, 14  # runs of near-identical frames
        x = x[repeat] + 0.001 * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
        index, features = official(x, s, ratio, **options)
        out = methods.compress_with("fastvid", x, s, grid, ratio=ratio, exact=False, **options)
        assert torch.equal(out.index, index)
        torch.testing.assert_close(out.features, features)


def test_qwen_path_reads_the_signals():
    # attention ranks the salient tokens as saliency would; frame_features replace the mean token in DySeg
    x, s, grid = tokens(6, 4, 4, 6, seed=2, drift=0.01)
    attention = torch.rand(6, 16, generator=torch.Generator().manual_seed(3))
    frame_features = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 3)
    signals = {"attention": attention, "frame_features": frame_features}
    out = methods.compress_with("fastvid", x, s, grid, ratio=0.25, c=2, signals=signals)
    assert out.report.details["segments"] == [3, 3] and out.report.details["signals"] == "signals"
    same = methods.compress_with("fastvid", x, attention, grid, ratio=0.25, c=2,
                                 signals={"frame_features": frame_features})
    assert torch.equal(out.index, same.index) and torch.equal(out.features, same.features)
    plain = methods.compress_with("fastvid", x, s, grid, ratio=0.25, c=2)
    assert plain.report.details["signals"] == "fallback"


@pytest.mark.parametrize("bad", [{"c": 0}, {"p": 1.5}, {"tau": float("nan")}, {"d": -0.1}, {"beta": 1.2},
                                 {"bug_compatible": True}, {"path": "llava"}, {"d": True}])
def test_bad_options(bad):
    with pytest.raises((ValueError, TypeError)):
        methods.make_config("fastvid", **bad)
