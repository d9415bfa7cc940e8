"""HoliTom (ottvid_cli/compression/methods/holitom.py): hand-computed steps, counts, the official code.

The official comparison runs holitom/llava_arch.py of cokeshao/HoliTom from a clone of it
under benchmarks/methods.py's MIRROR ($OTTVID_MIRROR, by default ~/.cache/ottvid/mirror), and skips without it.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_methods import official_or_skip

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.holitom import beta_merge, dpc_knn, pairwise_distances, segment_dp, static_runs

A = math.acos(0.9)  # consecutive cosine 0.9 (above tau 0.8)
B = math.acos(0.5)  # consecutive cosine 0.5 (below)


def turning(angles: list[list[float]]) -> torch.Tensor:
    """(T, N, 2) unit vectors at the given angles (angles[t][n])."""
    a = torch.tensor(angles, dtype=torch.float64)
    return torch.stack((a.cos(), a.sin()), -1).float()


def four_frames() -> torch.Tensor:
    """Two positions over four frames: consecutive cosines 0.9, 0.9, 0.5 and 0.9, 0.5, 0.9."""
    p0 = [0, A, 2 * A, 2 * A + B]
    p1 = [0, A, A + B, 2 * A + B]
    return turning([[p0[t], p1[t]] for t in range(4)])


def test_static_runs_and_dp_by_hand():
    cos = torch.tensor([[0.9, 0.9], [0.9, 0.5], [0.5, 0.9]])  # (T-1, N)
    run = static_runs(cos, 0.8)
    assert run.tolist() == [[2, 1], [1, 0], [0, 1]]
    # windows: [0,1] removes 2, [0,2] 2, [1,2] 1, [2,3] 1 -> best split [0,1] + [2,3], 3 removed
    assert segment_dp(run, 4, 1024) == ([(0, 1), (2, 3)], 3)
    assert segment_dp(run, 4, 1) == ([(0, 0), (1, 1), (2, 2), (3, 3)], 0)  # windows of 1 frame only


def test_static_needs_every_cosine_strictly_above_tau():
    cos = torch.tensor([[0.8, 0.81], [0.9, 0.81]])
    assert static_runs(cos, 0.8).tolist() == [[0, 2], [1, 1]]  # 0.8 is not > 0.8


def test_end_to_end_by_hand():
    x = four_frames()
    s = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # official: r' = 0.5 / (5 / 8) = 0.8; static parts round(2 * .8) = 2, round(1 * .8) = 1;
    # dynamic frames 2, 3 (position 0): ceil(.8) = 1 each -> 5 tokens
    out = methods.compress_with("holitom", x, s, (1, 2), ratio=0.5, exact=False)
    assert out.report.details["segments"] == [[0, 1], [2, 3]]
    assert out.report.details["static"] == [2, 1] and out.report.details["reduced"] == 3
    assert out.index.tolist() == [0, 1, 4, 5, 6]
    flat = x.reshape(8, 2)
    assert torch.allclose(out.features[0], (flat[0] + flat[2]) / 2)  # window means, at the first frame
    assert torch.allclose(out.features[1], (flat[1] + flat[3]) / 2)
    assert torch.allclose(out.features[3], (flat[5] + flat[7]) / 2)
    assert torch.equal(out.features[2], flat[4]) and torch.equal(out.features[4], flat[6])
    assert out.assignment.tolist() == [0, 1, 0, 1, 2, 3, 4, 3]
    # exact: 4 tokens by largest remainder of 4 * [2, 1, 0, 0, 1, 1] / 5 -> [1, 1, 0, 0, 1, 1]
    out = methods.compress_with("holitom", x, s, (1, 2), ratio=0.5)
    assert out.report.kept == 4 and out.report.details["official_count"] == 5
    assert out.index.tolist() in ([0, 4, 5, 6], [1, 4, 5, 6])  # one centre of the two static tokens
    static_row = 0
    other = 1 - int(out.index[0])  # the static token merged into the centre: 0.6 centre + 0.4 it
    centre = int(out.index[0])
    want = 0.6 * (flat[centre] + flat[centre + 2]) / 2 + 0.4 * (flat[other] + flat[other + 2]) / 2
    assert torch.allclose(out.features[static_row], want)
    assert out.assignment[[0, 1, 2, 3]].tolist() == [0, 0, 0, 0]


def test_dpc_knn_by_hand():
    points = torch.tensor([0.0, 0.1, 0.3, 5.0, 5.2]).view(1, 5, 1)
    dist = pairwise_distances(points)
    assert torch.allclose(dist[0, 0], torch.tensor([0.0, 0.1, 0.3, 5.0, 5.2]))
    valid = torch.ones(1, 5, dtype=torch.bool)
    # densities exp(-nn^2 / 2): 0, 1 (nn .1) above 2, 3, 4 (nn .2); delta: 0 -> 5.2 (densest, tie with 1
    # to the lower index), 1 -> .1, 2 -> .2, 3 -> 4.7, 4 -> .2; score = delta * density: centres 0 and 3
    centre, owner = dpc_knn(dist, valid, torch.tensor([2]), torch.tensor([2]))
    assert centre[0].tolist() == [True, False, False, True, False]
    assert owner[0].tolist() == [0, 0, 0, 3, 3]
    merged = beta_merge(points, centre, owner, 0.6)
    assert torch.allclose(merged[:, 0], torch.tensor([0.6 * 0 + 0.4 * 0.2, 0.6 * 5 + 0.4 * 5.2]))
    # a subset: only tokens 2, 3, 4 take part, one centre
    valid = torch.tensor([[False, False, True, True, True]])
    centre, owner = dpc_knn(dist, valid, torch.tensor([1]), torch.tensor([1]), order="score")
    assert owner[0].tolist()[:2] == [-1, -1] and int(centre.sum()) == 1


def test_contextual_share_and_validation():
    g = torch.Generator().manual_seed(0)
    x, s = torch.randn(6, 16, 8, generator=g), torch.rand(6, 16, generator=g)
    for d in (0.0, 0.5, 1.0):
        out = methods.compress_with("holitom", x, s, (4, 4), ratio=0.25, d=d)
        assert out.report.kept == 24
    with pytest.raises(ValueError, match="crashes"):
        methods.make_config("holitom", ratio=0.1, d=0.5, exact=False, bug_compatible=True)
    with pytest.raises(ValueError, match="exact=False"):
        methods.make_config("holitom", ratio=0.1, bug_compatible=True)
    with pytest.raises(ValueError, match="tau"):
        methods.make_config("holitom", ratio=0.1, tau=1.5)


def test_exact_when_merging_leaves_too_few():
    """A static video keeps fewer than M tokens even at r' = 1: single static tokens come back."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 9, 6, generator=g).expand(8, 9, 6) + 0.01 * torch.randn(8, 9, 6, generator=g)
    out = methods.compress_with("holitom", x, None, (3, 3), ratio=0.5)
    assert out.report.kept == 36 and out.report.details["unmerged"] == 36 - 9
    assert methods.compress_with("holitom", x, None, (3, 3), ratio=0.5, exact=False).report.kept == 9


# ---------------------------------------------------------------------------------------------
# the official code
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_official_code(seed, monkeypatch):
    official = official_or_skip("holitom")
    g = torch.Generator().manual_seed(seed)
    t, side, d = 12, 6, 24
    base = torch.randn(1, side * side, d, generator=g)
    x = base + 0.6 * torch.randn(t, side * side, d, generator=g)
    x[:, :18] = base[:, :18] + 0.05 * torch.randn(t, 18, d, generator=g)  # static half
    x[t // 2:] += 0.8 * torch.randn(1, side * side, d, generator=g)  # a scene cut
    s = torch.rand(t, side * side, generator=g)
    # the official density noise (torch.rand * 1e-6) as our deterministic tie-break: lower index first
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: -torch.arange(shape[-1], dtype=torch.float32).expand(shape))
    index, features = official(x, s, 0.2)
    monkeypatch.undo()
    ours = methods.compress_with("holitom", x, s, (side, side), ratio=0.2, exact=False, bug_compatible=True)
    assert torch.equal(ours.index, index)
    assert torch.allclose(ours.features, features, atol=1e-5)
    assert ours.report.details["official_count"] == index.numel()


def test_tau_follows_the_official_scripts_per_ratio():
    """Two frames at consecutive cosine 0.7: static under the scripts' T = 0.65 at 10 % (both positions
    merge across the frames), dynamic under T = 0.8 at 25 %; an explicit tau wins."""
    from ottvid_cli.compression.methods.holitom import HoliTomConfig, official_tau

    assert official_tau(0.1) == official_tau(0.05) == 0.65 and official_tau(0.15) == official_tau(0.25) == 0.8
    assert HoliTomConfig().tau is None and methods.get("holitom").defaults()["tau"] is None
    c = math.acos(0.7)
    x = turning([[0.0, 1.0] + [2.0 + i for i in range(8)], [c, 1.0 + c] + [2.0 + i + c for i in range(8)]])
    s = torch.ones(2, 10)
    low = methods.compress_with("holitom", x, s, (2, 5), ratio=0.1, exact=False)
    high = methods.compress_with("holitom", x, s, (2, 5), ratio=0.25, exact=False)
    assert low.report.details["tau"] == 0.65 and low.report.details["segments"] == [[0, 1]]
    assert low.report.details["reduced"] == 10  # every position static over the two frames
    assert high.report.details["tau"] == 0.8 and high.report.details["reduced"] == 0
    forced = methods.compress_with("holitom", x, s, (2, 5), ratio=0.1, exact=False, tau=0.8)
    assert forced.report.details["tau"] == 0.8 and forced.report.details["reduced"] == 0
