"""The authors' published code as a preset: OTTVidConfig.official() and its seven switches, each alone."""

import dataclasses
import math

import pytest
import torch

from ottvid_cli.compression import OTTVidConfig, compress, match_pairs, token_counts, transport_cost
from ottvid_cli.compression import stream as ottvid_module
from ottvid_cli.compression.budget import allocate_budget_rounds
from ottvid_cli.compression.transport import grid_positions, sinkhorn
from test_compress import check_consistent, video

SWITCHES = {  # field: (paper, official)
    "semantic_cost": ("cosine", "clamped"),
    "k_rounding": ("round", "floor"),
    "budget_cap": ("K", "K-1"),
    "budget_rounding": ("final", "per_round"),
    "location_norm": ("diagonal", "per_axis"),
    "sinkhorn_stop": ("tol", "fixed"),
    "merge_rule": ("strict", "inclusive"),
}


def test_official_values_and_presets():
    paper, official = OTTVidConfig(), OTTVidConfig.official()
    for name, (paper_value, official_value) in SWITCHES.items():
        assert getattr(paper, name) == paper_value and getattr(official, name) == official_value
    hyper = ("ratio", "gamma", "tau_m", "tau_b", "tau_c", "eps", "max_iter")
    assert [getattr(official, n) for n in hyper] == [0.1, 0.3, 0.3, 0.3, 0.3, 0.01, 200]
    assert [getattr(official, n) for n in ("mass", "budget", "alpha", "spatial")] == ["loo", "adaptive", "position",
                                                                                       "coverage"]
    assert OTTVidConfig.preset("paper") == paper
    assert OTTVidConfig.preset("official") == official
    assert OTTVidConfig.preset("paper", ratio=0.2) == OTTVidConfig(ratio=0.2)


def test_overrides_win():
    llava = OTTVidConfig.official(k_rounding="round")  # what the LLaVA adapter passes
    assert llava.k_rounding == "round" and llava.budget_cap == "K-1"
    assert OTTVidConfig.preset("official", ratio=0.25, tau_c=0.5) == dataclasses.replace(
        OTTVidConfig.official(), ratio=0.25, tau_c=0.5)


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("bad", ["", "ceil", None, 1, True])
def test_invalid_switch_values_are_refused(name, bad):
    with pytest.raises(ValueError, match=name):
        OTTVidConfig(**{name: bad})
    with pytest.raises(ValueError, match=name):
        OTTVidConfig.official(**{name: bad})


def test_invalid_preset_and_override():
    with pytest.raises(ValueError, match="preset"):
        OTTVidConfig.preset("authors")
    with pytest.raises(ValueError, match="ratio"):
        OTTVidConfig.official(ratio=0.0)
    with pytest.raises(TypeError):
        OTTVidConfig.official(no_such_field=1)
    with pytest.raises(ValueError, match="k_rounding"):
        token_counts(4, 256, 0.2, 0.3, k_rounding="ceil")


# 1. semantic cost -------------------------------------------------------------------------------

def test_semantic_cost_clamps_negative_cosines():
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.6, 0.8]]])  # (T=2, k=2, D=2)
    positions = torch.zeros(2, 2, 2)
    alpha = torch.ones(1)  # semantic term only
    paper = transport_cost(x, positions, alpha, (1, 1))
    clamped = transport_cost(x, positions, alpha, (1, 1), semantic="clamped")
    # cosines [[-1, 0.6], [0, 0.8]]: 1 - cos vs 1 - max(0, cos)
    torch.testing.assert_close(paper, torch.tensor([[[2.0, 0.4], [1.0, 0.2]]]))
    torch.testing.assert_close(clamped, torch.tensor([[[1.0, 0.4], [1.0, 0.2]]]))


# 2. K rounding ----------------------------------------------------------------------------------

def test_k_floor_differs_from_round_at_n_256():
    # N r_s = 256 * 0.2^0.7 = 82.98: round gives 83, the authors' int() gives 82
    assert token_counts(16, 256, 0.2, 0.3).K == 83
    assert token_counts(16, 256, 0.2, 0.3, k_rounding="floor").K == 82
    assert token_counts(16, 144, 0.1, 0.3, k_rounding="floor").K == 28  # Qwen2.5-VL's 9x16 grid: 28.7
    assert token_counts(16, 4, 0.01, 0.3, k_rounding="floor").K == 1  # max(1, floor(0.16))
    x, s, grid = video(t=3, h=16, w=16, d=4)
    assert compress(x, s, grid, OTTVidConfig(ratio=0.2, k_rounding="floor")).report.K == 82
    assert compress(x, s, grid, OTTVidConfig.official(ratio=0.2, k_rounding="round")).report.K == 83


# 3. per-pair cap --------------------------------------------------------------------------------

def test_cap_k_minus_one():
    # gamma = 1: r_s = 1, K = N = 16; M = round(0.1 * 2 * 16) = 3, so T K - M = 29 removals are asked for.
    # The paper's cap K: K moves down to M = 3 so that exactly M come out (3 removals in one pair).
    paper_counts = token_counts(2, 16, 0.1, 1.0)
    assert (paper_counts.K, paper_counts.B_tot) == (3, 3)
    assert token_counts(2, 16, 0.1, 1.0, budget_cap="K-1").B_tot == 15  # the authors': K stays 16, at most K - 1
    x, s, grid = video(t=2, h=4, w=4)
    paper = compress(x, s, grid, OTTVidConfig(ratio=0.1, gamma=1.0)).report
    capped = compress(x, s, grid, OTTVidConfig(ratio=0.1, gamma=1.0, budget_cap="K-1")).report
    assert (paper.B, paper.kept) == ([3], 3)
    assert (capped.B, capped.kept) == ([15], 17)
    budgets, _ = allocate_budget_rounds(torch.tensor([0.0, 9.0]), 6, 3, 0.3)
    assert budgets.tolist() == [3, 3]


# 4. integer redistribution ----------------------------------------------------------------------

def test_integer_redistribution_by_hand():
    # softmax(-W / 0.3) = [1/2, 1/4, 1/4]; total 10; cap 4.
    w = torch.tensor([0.0, 0.3 * math.log(2.0), 0.3 * math.log(2.0)], dtype=torch.float64)
    # Round 1: shares 5, 2.5, 2.5 -> floors 5, 2, 2; the unit left goes to the largest fraction
    # (a tie of .5: the lower pair, 1) -> 5, 3, 2; clipped at 4 -> 4, 3, 2; 1 overflows, pair 0 leaves.
    # Round 2: 1 unit over pairs 1, 2 (1/2 each) -> floors 0, 0; the tie goes to pair 1 -> 4, 4, 2.
    budgets, rounds = allocate_budget_rounds(w, 10, 4, 0.3, rounding="per_round")
    assert budgets.tolist() == [4, 4, 2] and rounds == 1
    # The paper's reading shares real numbers (4, 2.5, 2.5, then 4, 3, 3) and rounds once at the end.
    budgets, rounds = allocate_budget_rounds(w, 10, 4, 0.3)
    assert budgets.tolist() == [4, 3, 3] and rounds == 1


@pytest.mark.parametrize("seed", range(6))
def test_integer_redistribution_places_everything_under_the_cap(seed):
    g = torch.Generator().manual_seed(seed)
    pairs, cap = 7, 5
    total = int(torch.randint(0, pairs * cap + 1, (1,), generator=g))
    budgets, rounds = allocate_budget_rounds(torch.rand(pairs, generator=g), total, cap, 0.3, "per_round")
    assert int(budgets.sum()) == total and int(budgets.max()) <= cap and int(budgets.min()) >= 0
    assert 0 <= rounds <= pairs


def test_integer_redistribution_without_overflow_is_floor_plus_largest_remainder():
    w = torch.tensor([0.1, 0.2, 0.4])
    # shares 14.39, 10.31, 5.29: floors 14, 10, 5 and the unit left to pair 0, as the paper's rounding
    assert allocate_budget_rounds(w, 30, 100, 0.3, "per_round")[0].tolist() == [15, 10, 5]


# 5. location cost -------------------------------------------------------------------------------

def location_cost(grid, a, b, norm):
    """c_loc between grid cells a and b (flat indices), through transport_cost with alpha = 0."""
    x = torch.ones(2, 1, 3)
    positions = grid_positions(torch.tensor([[a], [b]]), grid)
    return float(transport_cost(x, positions, torch.zeros(1), grid, location=norm))


def test_location_per_axis_on_a_9x16_grid():
    grid = (9, 16)  # Qwen2.5-VL, 16:9 video
    down, right, corner = 8 * 16, 15, 8 * 16 + 15  # (8, 0), (0, 15), (8, 15) from (0, 0)
    assert location_cost(grid, 0, down, "diagonal") == pytest.approx(8 / 17)  # diagonal sqrt(64 + 225) = 17
    assert location_cost(grid, 0, right, "diagonal") == pytest.approx(15 / 17)
    assert location_cost(grid, 0, down, "per_axis") == pytest.approx(1 / math.sqrt(2))  # (1, 0) / sqrt(2)
    assert location_cost(grid, 0, right, "per_axis") == pytest.approx(1 / math.sqrt(2))
    assert location_cost(grid, 0, corner, "diagonal") == pytest.approx(1.0)
    assert location_cost(grid, 0, corner, "per_axis") == pytest.approx(1.0)


def test_location_per_axis_equals_the_paper_on_square_grids_and_handles_axes_of_one():
    for a, b in [(0, 5), (3, 12), (7, 8)]:
        assert location_cost((4, 4), a, b, "per_axis") == pytest.approx(location_cost((4, 4), a, b, "diagonal"))
    # one row: the row term stays 0 (the authors' linspace(0, 1, 1) = [0]); the paper divides by W - 1
    assert location_cost((1, 5), 0, 4, "diagonal") == pytest.approx(1.0)
    assert location_cost((1, 5), 0, 4, "per_axis") == pytest.approx(1 / math.sqrt(2))
    assert location_cost((3, 1), 0, 2, "per_axis") == pytest.approx(1 / math.sqrt(2))
    assert location_cost((1, 1), 0, 0, "per_axis") == location_cost((1, 1), 0, 0, "diagonal") == 0.0


# 6. Sinkhorn iterations -------------------------------------------------------------------------

def test_fixed_iterations_never_stop_early():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 6, generator=g), -1)
    b = torch.softmax(torch.randn(3, 6, generator=g), -1)
    c = torch.rand(3, 6, 6, generator=g)
    _, early, _ = sinkhorn(a, b, c, eps=0.5, max_iter=200, tol=1e-4, returns="error")
    assert early < 200  # an easy problem converges long before the cap
    for absorb in (False, True):
        plan, n, err = sinkhorn(a, b, c, eps=0.5, max_iter=200, tol=1e-4, absorb=absorb, early_stop=False,
                                returns="error")
        assert n == 200
        want, _, want_err = sinkhorn(a, b, c, eps=0.5, max_iter=200, tol=1e-30, absorb=absorb, returns="error")
        torch.testing.assert_close(plan, want, atol=0, rtol=0)
        torch.testing.assert_close(err, want_err, atol=0, rtol=0)


def test_compress_runs_exactly_max_iter():
    x, s, grid = video(t=4, h=4, w=4)
    assert compress(x, s, grid, OTTVidConfig(ratio=0.25, eps=0.5)).report.sinkhorn_iterations < 200
    fixed = compress(x, s, grid, OTTVidConfig(ratio=0.25, eps=0.5, sinkhorn_stop="fixed")).report
    assert fixed.sinkhorn_iterations == 200
    assert compress(x, s, grid, OTTVidConfig.official(ratio=0.25)).report.sinkhorn_iterations == 200


# 7. merge rule ----------------------------------------------------------------------------------

def test_cost_equal_to_tau_c_merges_only_when_inclusive():
    plan = torch.tensor([[[0.5, 0.0], [0.0, 0.5]]])
    cost = torch.tensor([[[0.25, 0.9], [0.9, 0.1]]])  # source 0's match costs exactly tau_c
    strict = match_pairs(plan, cost, torch.tensor([2]), tau_c=0.25)
    inclusive = match_pairs(plan, cost, torch.tensor([2]), tau_c=0.25, inclusive=True)
    assert strict.merged.tolist() == [[False, True]] and strict.pruned.tolist() == [[True, False]]
    assert inclusive.merged.tolist() == [[True, True]] and inclusive.pruned.tolist() == [[False, False]]


def test_compress_passes_the_merge_rule(monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("inclusive"))
        return match_pairs(*args, **kwargs)

    monkeypatch.setattr(ottvid_module, "match_pairs", spy)
    x, s, grid = video(t=3)
    compress(x, s, grid, OTTVidConfig())
    compress(x, s, grid, OTTVidConfig(merge_rule="inclusive"))
    assert seen == [False, True]


# each cost switch reaches compress ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["semantic_cost", "location_norm"])
def test_cost_switches_change_the_transport_difficulty(name):
    # correlated groups (alpha < 1: the location term counts) on a 9x16 grid; a large eps spreads the
    # plan over every entry, negative cosines included
    x, s, grid = video(t=4, h=9, w=16, d=8, drift=1.0)
    paper = compress(x, s, grid, OTTVidConfig(ratio=0.2, eps=1.0)).report
    switched = compress(x, s, grid, OTTVidConfig(ratio=0.2, eps=1.0, **{name: SWITCHES[name][1]})).report
    assert all(a < 1.0 for a in paper.alpha)
    assert all(abs(p - q) > 1e-4 for p, q in zip(paper.W, switched.W))


# the whole preset -------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.1, 0.15, 0.2, 0.25, 0.5])
def test_official_compress_invariants(ratio):
    t, h, w = 8, 6, 6
    x, s, grid = video(t=t, h=h, w=w)
    cfg = OTTVidConfig.official(ratio=ratio)
    out = compress(x, s, grid, cfg)
    r = out.report
    counts = token_counts(t, h * w, ratio, cfg.gamma, "floor", "K-1")
    assert (r.K, r.B_tot) == (counts.K, counts.B_tot) and r.K == max(1, math.floor(h * w * ratio**0.7))
    # no clamp binds at these ratios: exactly M = max(1, round(r T N)) tokens, as in the authors' code
    assert r.B_tot == t * r.K - r.M and r.kept == r.M == max(1, round(ratio * t * h * w))
    assert sum(r.B) == r.B_tot == sum(r.merges) + sum(r.prunes)
    assert all(0 <= b <= r.K - 1 for b in r.B)
    assert r.sinkhorn_iterations == 200
    check_consistent(out, x, cfg)
    again = compress(x, s, grid, cfg)  # deterministic
    assert torch.equal(again.features, out.features) and torch.equal(again.assignment, out.assignment)


def test_official_count_when_the_cap_binds():
    # T K - M = 2 * 16 - 3 = 29 removals cannot fit one pair of K - 1 = 15: T K - 15 = 17 tokens stay,
    # as in the authors' code, whose budget loop leaves the remainder unused.
    x, s, grid = video(t=2, h=4, w=4)
    r = compress(x, s, grid, OTTVidConfig.official(gamma=1.0)).report
    assert (r.M, r.K, r.B_tot, r.kept) == (3, 16, 15, 17)


# timing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [OTTVidConfig(ratio=0.2), OTTVidConfig.official(ratio=0.2)])
def test_timer_does_not_change_the_outputs(cfg):
    x, s, grid = video(t=5)
    timed = compress(x, s, grid, cfg, timer=True)
    stages = {"similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge", "total"}
    assert set(timed.report.timings_ms) == stages
    for timer in (None, False):
        out = compress(x, s, grid, cfg, timer=timer)
        for field in ("features", "index", "assignment", "selected"):
            assert torch.equal(getattr(out, field), getattr(timed, field))
        plain, want = out.report.to_dict(), timed.report.to_dict()
        assert set(plain.pop("timings_ms")) == (stages if timer is None else set())  # None: free on the CPU
        want.pop("timings_ms")
        assert plain == want
    with pytest.raises(TypeError):
        compress(x, s, grid, cfg, timer="yes")
