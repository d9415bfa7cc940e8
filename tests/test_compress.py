"""compress(): the stages end to end, its counts, report and degenerate inputs."""

import json

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import OTTVidConfig, compress, token_counts
from tests.support import reference as ref

REPORT_KEYS = {"T", "N", "K", "M", "r_s", "r_t", "B_tot", "alpha", "W", "B", "merges", "prunes",
               "overflow_rounds", "sinkhorn_iterations", "sinkhorn_error", "timings_ms"}


def video(t=6, h=4, w=4, d=8, seed=0, drift=0.3):
    """Correlated groups (a scene plus noise) with non-uniform saliency."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, h * w, d, generator=g)
    x = base + drift * torch.randn(t, h * w, d, generator=g)
    s = torch.rand(t, h * w, generator=g)
    return x, s, (h, w)


def check_consistent(out, features, cfg):
    """Assignment, index and features tell the same story."""
    t, n, d = features.shape
    flat = features.reshape(t * n, d).float()
    m = out.features.shape[0]
    assert out.index.shape == (m,) and out.assignment.shape == (t * n,)
    assert torch.all(out.index[1:] > out.index[:-1])  # ascending by root
    assert int(out.assignment.min()) >= -1 and int(out.assignment.max()) < m
    for row in range(m):
        members = (out.assignment == row).nonzero().flatten()
        assert members.numel() >= 1
        assert int(members.min()) == int(out.index[row])  # the root is the earliest member
        torch.testing.assert_close(out.features[row].float(), flat[members].mean(0), atol=2e-2, rtol=1e-2)
    assert out.report.kept == m
    assert out.features.dtype == features.dtype


def test_counts_follow_the_issue_formulas():
    c = token_counts(16, 256, 0.1, 0.3)
    assert (c.M, c.K, c.B_tot) == (410, 51, 406)
    assert abs(c.r_s - 0.1**0.7) < 1e-12 and abs(c.r_t - 0.1**0.3) < 1e-12
    c = token_counts(16, 256, 0.25, 0.3)
    assert (c.M, c.K) == (1024, round(256 * 0.25**0.7))
    assert token_counts(1, 256, 0.1, 0.3).K == 26  # T == 1: spatial only, M tokens
    assert token_counts(3, 4, 0.001, 0.3).M == 1  # at least one token
    assert token_counts(2, 2, 0.25, 0.3).M == 1  # round(0.25 * 4) = 1 (half to even)


@pytest.mark.parametrize("ratio", [0.1, 0.15, 0.2, 0.25, 0.5])
def test_output_has_exactly_round_ratio_tokens(ratio):
    x, s, grid = video(t=8, h=6, w=6)
    out = compress(x, s, grid, OTTVidConfig(ratio=ratio))
    assert out.features.shape[0] == round(ratio * 8 * 36)
    check_consistent(out, x, None)


def test_report_contents_and_json():
    x, s, grid = video()
    out = compress(x, s, grid)
    r = out.report.to_dict()
    assert REPORT_KEYS <= set(r)
    json.dumps(r)
    for key in ("alpha", "W", "B", "merges", "prunes"):
        assert len(r[key]) == r["T"] - 1
    assert sum(r["B"]) == r["B_tot"] == sum(r["merges"]) + sum(r["prunes"])
    assert all(0 <= b <= r["K"] for b in r["B"])
    assert r["M"] == r["kept"] == out.features.shape[0]
    assert 1 <= r["sinkhorn_iterations"] <= 200 and r["sinkhorn_error"] >= 0
    assert {"similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge", "total"} <= set(r["timings_ms"])
    assert r["config"]["ratio"] == 0.1


def test_matches_the_literal_pipeline():
    """Every stage recomputed by the loop-by-loop float64 reference (POT for the plans)."""
    t, h, w, d = 5, 4, 5, 6
    x, s, grid = video(t=t, h=h, w=w, d=d, seed=4, drift=0.6)
    cfg = OTTVidConfig(ratio=0.3)
    out = compress(x, s, grid, cfg)
    counts = token_counts(t, h * w, cfg.ratio, cfg.gamma)
    xs, ws = x.double().numpy(), s.double().numpy()
    sel = [ref.select(xs[i], ws[i], counts.K) for i in range(t)]
    mass = [ref.mass(xs[i], ws[i], sel[i], cfg.tau_m) for i in range(t)]
    alphas = [ref.alpha(xs[i], xs[i + 1]) for i in range(t - 1)]
    costs = [ref.cost(xs[i], xs[i + 1], sel[i], sel[i + 1], grid, alphas[i]) for i in range(t - 1)]
    plans = [ot.sinkhorn(mass[i], mass[i + 1], costs[i], cfg.eps, method="sinkhorn_log",
                         numItermax=out.report.sinkhorn_iterations, stopThr=0.0, warn=False) for i in range(t - 1)]
    W = [float((plans[i] * costs[i]).sum()) for i in range(t - 1)]
    np.testing.assert_allclose(out.report.alpha, alphas, rtol=1e-5)
    np.testing.assert_allclose(out.report.W, W, rtol=1e-3)
    budgets, _ = ref.budget(W, counts.B_tot, counts.K, cfg.tau_b)
    assert out.report.B == budgets
    roots, membership = ref.execute(plans, costs, budgets, cfg.tau_c, t, counts.K)
    n = h * w
    assert out.index.tolist() == [i * n + sel[i][j] for i, j in roots]
    row_of = {root: r for r, root in enumerate(roots)}
    want = [-1] * (t * n)
    for (i, j), root in membership.items():
        want[i * n + sel[i][j]] = row_of[root]
    assert out.assignment.tolist() == want


def test_ratio_one_is_identity():
    x, s, grid = video()
    out = compress(x.half(), s, grid, OTTVidConfig(ratio=1.0))
    assert torch.equal(out.features, x.half().reshape(-1, x.shape[-1]))
    assert torch.equal(out.index, torch.arange(x.shape[0] * x.shape[1]))
    assert torch.equal(out.assignment, out.index)
    assert out.report.B_tot == 0 and out.report.alpha == [] and out.report.W == []


def test_single_group_is_spatial_only():
    x, s, grid = video(t=1, h=8, w=8)
    out = compress(x, s, grid, OTTVidConfig(ratio=0.25))
    assert out.features.shape[0] == 16 and out.report.B_tot == 0 and out.report.B == []
    assert torch.equal(out.features, x[0, out.index])  # kept tokens unchanged
    check_consistent(out, x, None)


def test_two_groups_and_single_token_groups():
    x, s, grid = video(t=2, h=3, w=3)
    out = compress(x, s, grid, OTTVidConfig(ratio=0.3))
    assert out.features.shape[0] == round(0.3 * 18)
    check_consistent(out, x, None)
    x1 = torch.randn(5, 1, 4)
    out = compress(x1, torch.rand(5, 1), (1, 1), OTTVidConfig(ratio=0.4))
    assert out.report.K == 1 and out.features.shape[0] == 2
    check_consistent(out, x1, None)


def test_identical_groups_merge_into_the_first():
    g = torch.Generator().manual_seed(1)
    frame = torch.randn(1, 16, 8, generator=g)
    x = frame.repeat(6, 1, 1)
    saliency = torch.rand(1, 16, generator=g).repeat(6, 1)
    out = compress(x, saliency, (4, 4), OTTVidConfig(ratio=0.25))
    assert out.features.shape[0] == 24
    assert sum(out.report.prunes) == 0  # every match costs 0 < tau_c
    for row in range(24):
        members = (out.assignment == row).nonzero().flatten()
        assert len(set((members % 16).tolist())) == 1  # a token merges with itself in the next group
    torch.testing.assert_close(out.features, frame[0, out.index % 16])  # the average of identical tokens
    check_consistent(out, x, None)


def test_constant_features_and_zero_saliency():
    x = torch.ones(4, 9, 3)
    out = compress(x, torch.zeros(4, 9), (3, 3), OTTVidConfig(ratio=0.3))
    assert out.features.shape[0] == round(0.3 * 36)
    assert torch.isfinite(out.features).all()
    check_consistent(out, x, None)
    zeros = torch.zeros(3, 4, 2)
    out = compress(zeros, torch.zeros(3, 4), (2, 2), OTTVidConfig(ratio=0.5))
    assert out.features.shape[0] == 6 and torch.all(out.features == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_inputs(dtype):
    x, s, grid = video()
    out = compress(x.to(dtype), s.to(dtype), grid)
    ref32 = compress(x.to(dtype).float(), s.to(dtype).float(), grid)
    assert out.features.dtype == dtype
    assert torch.equal(out.index, ref32.index) and torch.equal(out.assignment, ref32.assignment)
    check_consistent(out, x.to(dtype), None)


def test_ratio_so_small_that_k_is_one():
    x, s, grid = video(t=10, h=4, w=4)
    out = compress(x, s, grid, OTTVidConfig(ratio=0.02))
    assert out.report.K == 1
    assert out.features.shape[0] == max(1, round(0.02 * 160))
    check_consistent(out, x, None)


def test_deterministic():
    x, s, grid = video(t=7)
    a, b = compress(x, s, grid), compress(x.clone(), s.clone(), grid)
    assert torch.equal(a.features, b.features) and torch.equal(a.assignment, b.assignment)
    assert a.report.W == b.report.W


def test_inputs_are_not_modified():
    x, s, grid = video()
    x0, s0 = x.clone(), s.clone()
    compress(x, s, grid)
    assert torch.equal(x, x0) and torch.equal(s, s0)


@pytest.mark.parametrize(
    "features, saliency, grid, message",
    [
        (torch.randn(4, 16), torch.rand(4, 16), (4, 4), "(T, N, D)"),
        (torch.randn(2, 16, 3), torch.rand(2, 15), (4, 4), "saliency"),
        (torch.randn(2, 16, 3), torch.rand(2, 16), (3, 5), "grid"),
        (torch.full((2, 16, 3), float("nan")), torch.rand(2, 16), (4, 4), "NaN"),
        (torch.randn(2, 16, 3), -torch.rand(2, 16), (4, 4), "non-negative"),
        (torch.randint(0, 5, (2, 16, 3)), torch.rand(2, 16), (4, 4), "floating"),
    ],
)
def test_bad_input_raises_value_error(features, saliency, grid, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compress(features, saliency, grid)


@pytest.mark.parametrize(
    "kwargs",
    [{"ratio": 0}, {"ratio": 1.5}, {"ratio": float("nan")}, {"gamma": -0.1}, {"tau_m": 0}, {"eps": -1},
     {"max_iter": 0}, {"max_iter": 2.5}, {"mass": "x"}, {"budget": "x"}, {"alpha": "x"}, {"alpha": 0.3},
     {"spatial": "x"}, {"tau_c": -1}],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        OTTVidConfig(**kwargs)


def test_config_defaults_are_the_papers():
    c = OTTVidConfig()
    assert (c.ratio, c.gamma, c.tau_m, c.tau_b, c.tau_c, c.eps, c.max_iter, c.tol) == (
        0.1, 0.3, 0.3, 0.3, 0.3, 0.01, 200, 1e-5)
    assert (c.mass, c.budget, c.alpha, c.spatial) == ("loo", "adaptive", "position", "coverage")


def test_ablation_switches_change_the_decisions():
    x, s, grid = video(t=8, h=6, w=6, seed=3, drift=0.8)
    base = compress(x, s, grid)
    assert compress(x, s, grid, OTTVidConfig(budget="uniform")).report.B != base.report.B or len(set(base.report.B)) == 1
    uniform_mass = compress(x, s, grid, OTTVidConfig(mass="uniform"))
    assert uniform_mass.report.W != base.report.W
    assert compress(x, s, grid, OTTVidConfig(alpha=1.0)).report.alpha == [1.0] * 7


@settings(max_examples=60, deadline=None)
@given(
    t=st.integers(1, 6),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    d=st.integers(1, 6),
    ratio=st.floats(0.01, 1.0),
    gamma=st.floats(0.0, 1.0),
    spatial=st.sampled_from(["coverage", "saliency", "divprune", "adts", "scope"]),
    mass=st.sampled_from(["loo", "uniform"]),
    budget=st.sampled_from(["adaptive", "uniform"]),
    alpha=st.sampled_from(["position", "kernel", "global", 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_invariants(t, h, w, d, ratio, gamma, spatial, mass, budget, alpha, seed):
    x, s, grid = video(t=t, h=h, w=w, d=d, seed=seed)
    cfg = OTTVidConfig(ratio=ratio, gamma=gamma, spatial=spatial, mass=mass, budget=budget, alpha=alpha)
    out = compress(x, s, grid, cfg)
    counts = token_counts(t, h * w, ratio, gamma)
    r = out.report
    assert (r.M, r.K, r.B_tot) == (counts.M, counts.K, counts.B_tot)
    if ratio < 1.0:
        spatial_kept = counts.K * t
        assert r.kept == spatial_kept - r.B_tot
        if t > 1 and counts.K <= counts.M <= spatial_kept:
            assert r.kept == counts.M  # exactly round(ratio * T * N) whenever feasible
        assert int((out.assignment >= 0).sum()) <= spatial_kept
    assert sum(r.B) == r.B_tot and sum(r.merges) + sum(r.prunes) == r.B_tot
    check_consistent(out, x, cfg)
    again = compress(x, s, grid, cfg)
    assert torch.equal(again.features, out.features) and torch.equal(again.assignment, out.assignment)
