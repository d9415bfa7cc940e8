"""divprune: max-min diversity per frame, exact split, bug_compatible, against the official loop."""

import math

import pytest
import torch

from ottvid_cli.compression import methods
from test_methods import check_contract, official_or_skip, tokens


def at(*degrees):
    """Unit 2-D tokens at the given angles."""
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees])


# frame 0: a=(1,0), b close to a, c=(0,1), d=(-1,0); frame 1: angles 0, 20, 28, 29 degrees
FRAME0 = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [-1.0, 0.0]])
FRAME1 = at(0, 20, 28, 29)


def test_farthest_point_order_in_one_frame():
    # first: d, the most isolated (nearest other at distance 1); then a (distance 2 from d);
    # then c (distance 1 to both) rather than b (0.005 from a)
    out = methods.compress_with("divprune", FRAME0[None], None, (2, 2), ratio=0.75)
    assert out.index.tolist() == [0, 2, 3]
    assert torch.equal(out.features, FRAME0[[0, 2, 3]])


def test_remainder_goes_to_the_frame_whose_next_pick_is_farthest():
    x = torch.stack([FRAME0, FRAME1])
    out = methods.compress_with("divprune", x, None, (2, 2), ratio=3 / 8)  # M = 3: 1 each, 1 extra
    # frame 0's second pick (a, 2 from d) beats frame 1's (about 1 - cos 29 degrees); frame 1
    # keeps its most isolated token, the one at 0 degrees (nearest other 20 degrees away)
    assert out.index.tolist() == [0, 3, 4]
    assert out.report.details["per_selection"] == [2, 1]


def test_bug_compatible_repicks_a_duplicate():
    # three copies of a and one c: the official loop picks c, a, then a again (nothing excludes it)
    x = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    intended = methods.compress_with("divprune", x, None, (2, 2), ratio=0.75)
    assert intended.index.tolist() == [0, 1, 3]
    buggy = methods.compress_with("divprune", x, None, (2, 2), ratio=0.75, exact=False, bug_compatible=True)
    assert buggy.index.tolist() == [0, 3]
    official = official_or_skip("divprune")
    index, _ = official(x, None, 0.75)
    assert index.unique().tolist() == [0, 3]


def test_bug_compatible_needs_exact_false():
    with pytest.raises(ValueError, match="exact=False"):
        methods.make_config("divprune", bug_compatible=True)


def test_global_selection_is_one_selection_over_all_tokens():
    x, s, grid = tokens(3, 2, 4, 5, seed=2)
    out = methods.compress_with("divprune", x, s, grid, ratio=0.25, per_frame=False)
    one = methods.compress_with("divprune", x.reshape(1, 24, 5), s.reshape(1, 24), (4, 6), ratio=0.25)
    assert torch.equal(out.index, one.index)
    check_contract(out, x, 0.25)


@pytest.mark.parametrize("per_frame", [True, False])
@pytest.mark.parametrize("bug_compatible", [False, True])
@pytest.mark.parametrize("ratio", [0.1, 0.3])
def test_not_exact_reproduces_the_official(per_frame, bug_compatible, ratio):
    official = official_or_skip("divprune")
    for seed in range(2):
        x, s, grid = tokens(4, 6, 6, 12, seed=seed)
        index, features = official(x, s, ratio, per_frame=per_frame)
        out = methods.compress_with("divprune", x, s, grid, ratio=ratio, exact=False, per_frame=per_frame,
                                    bug_compatible=bug_compatible)
        assert torch.equal(out.index, index) and torch.equal(out.features, features)


def test_official_count_at_paper_shape():
    x, s, grid = tokens(16, 16, 16, 4, seed=0)
    out = methods.compress_with("divprune", x, s, grid, ratio=0.1, exact=False)
    assert out.features.shape[0] == 16 * 26  # int(round(25.6)) per frame


def reference_divprune(x, m):
    """A straightforward DivPrune per frame (Python loops over picks), then the exact split of m: each frame
    its first floor(m / T) picks, one more in the m mod T frames whose next pick is the farthest."""
    t, n, _ = x.shape
    picks, gains = [], []
    for f in range(t):
        unit = x[f] / x[f].norm(dim=-1, keepdim=True)
        dist = (1.0 - unit @ unit.T).clamp_min(0.0)
        isolation = [min(float(dist[j, k]) for k in range(n) if k != j) for j in range(n)]
        order, gain = [max(range(n), key=lambda j: (isolation[j], -j))], [max(isolation)]
        while len(order) < min(n, m // t + 1):
            nearest = {j: min(float(dist[j, p]) for p in order) for j in range(n) if j not in order}
            best = max(nearest, key=lambda j: (nearest[j], -j))
            order.append(best)
            gain.append(nearest[best])
        picks.append(order)
        gains.append(gain)
    base, extra = divmod(m, t)
    lucky = sorted(range(t), key=lambda f: (-gains[f][base] if base < len(gains[f]) else float("inf"), f))[:extra]
    return sorted(f * n + j for f in range(t) for j in picks[f][:base + (f in lucky)])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ratio", [0.1, 0.27])
def test_matches_a_straightforward_reference(seed, ratio):
    x, s, grid = tokens(5, 5, 6, 16, seed=seed)
    out = methods.compress_with("divprune", x, s, grid, ratio=ratio)
    assert out.index.tolist() == reference_divprune(x, methods.target_count(ratio, 5, 30))
    assert torch.equal(out.features, x.reshape(150, 16)[out.index])
