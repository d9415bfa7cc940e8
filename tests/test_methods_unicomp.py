"""UniComp (ottvid_cli/compression/methods/unicomp.py): hand-computed steps, counts, the official code.

The official comparison runs unicomp/llava_arch.py of TimeMarker-LLM/UniComp from a clone of it
under benchmarks/methods.py's MIRROR ($OTTVID_MIRROR, by default ~/.cache/ottvid/mirror), and skips without it.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_methods import official_or_skip

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.unicomp import capped_apportion, fuse_frames, official_allocation, sdc_select


def test_fusion_compares_with_the_group_first_frame():
    u = [[0.0] * 6 for _ in range(6)]
    u[1][0] = 0.001  # joins group 0
    u[2][0], u[2][1] = 0.006, 0.001  # close to frame 1 but not to the group's first frame: new group
    u[3][2] = 0.005  # exactly uf: joins (inclusive)
    u[4][2] = 0.002  # joins, the group now holds 3 frames
    u[5][2] = 0.0  # would join, but the group is full at `longest` = 3
    assert fuse_frames(u, 0.005, 3) == [0, 2, 5]
    assert fuse_frames(u, 0.005, 11) == [0, 2]
    assert fuse_frames(u, 0.004, 11) == [0, 2, 3]


def test_official_allocation_by_hand():
    # softmax(log p) = p; floor(p * 20) = [10, 5, 5], cap 8 -> [8, 5, 5]; the 2 left go 1 each to the
    # frames under the cap -> [8, 6, 6]
    uniques = torch.tensor([0.5, 0.25, 0.25]).log()
    assert official_allocation(uniques, 20, 8).tolist() == [8, 6, 6]
    # no frame above its cap: the floors stay, one token lost (the 400 of 410 at 16 x 256)
    assert official_allocation(torch.tensor([0.375, 0.375, 0.25]).log(), 10, 8).tolist() == [3, 3, 2]
    # ours: the target apportioned with caps, largest remainder (ties to the lower index)
    assert capped_apportion(torch.tensor([0.375, 0.375, 0.25]), 10, torch.tensor([8, 8, 8])).tolist() == [4, 4, 2]
    assert capped_apportion(torch.tensor([0.25, 0.25, 0.5]), 10, torch.tensor([8, 8, 8])).tolist() == [3, 2, 5]
    assert capped_apportion(torch.tensor([0.5, 0.25, 0.25]), 20, torch.tensor([8, 8, 8])).tolist() == [8, 6, 6]
    assert capped_apportion(torch.tensor([1.0, 1.0, 1.0]), 10, torch.tensor([0, 2, 9])).tolist() == [0, 2, 8]
    assert capped_apportion(torch.tensor([1.0, 1.0]), 10, torch.tensor([2, 3])).tolist() == [2, 3]


def test_sdc_selection_by_hand():
    # uniqueness order 0, 1, 2, 3 (rank), similar pairs along a chain 0-1, 1-2, 2-3: greedy keeps 0 and 2
    similar = torch.eye(4, dtype=torch.bool)
    for a, b in ((0, 1), (1, 2), (2, 3)):
        similar[a, b] = similar[b, a] = True
    rank = torch.arange(4)
    assert sdc_select(similar[None], rank[None]).tolist() == [[True, False, True, False]]
    # the same chain in the reverse uniqueness order keeps 3 and 1
    assert sdc_select(similar[None], rank.flip(0)[None]).tolist() == [[False, True, False, True]]


def four_tokens():
    """One frame: a = e0, b = e0 + .1 e1 (similar to a), c = e2, d = e3."""
    x = torch.zeros(1, 4, 4)
    x[0, 0, 0] = 1.0
    x[0, 1, 0], x[0, 1, 1] = 1.0, 0.1
    x[0, 2, 2] = 1.0
    x[0, 3, 3] = 1.0
    return x


def test_sdc_features_by_hand():
    x = four_tokens()
    # uniqueness (mean similarity, ascending): c, d, then a, b; a covers b (1 - cos = .005 < .2)
    out = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.75)
    assert out.index.tolist() == [0, 2, 3]
    assert torch.allclose(out.features[0], 0.5 * x[0, 0] + 0.5 * (x[0, 0] + x[0, 1]) / 2)
    assert torch.equal(out.features[1], x[0, 2]) and torch.equal(out.features[2], x[0, 3])
    assert out.assignment.tolist() == [0, 0, 1, 2]
    # two tokens: the two most unique; a is cut, and b, covered only by a, is dropped
    out = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5)
    assert out.index.tolist() == [2, 3] and out.assignment.tolist() == [-1, -1, 0, 1]


def test_official_count_400_of_410():
    g = torch.Generator().manual_seed(0)
    x, s = torch.randn(16, 256, 64, generator=g), torch.rand(16, 256, generator=g)
    official = methods.compress_with("unicomp", x, s, (16, 16), ratio=0.1, exact=False)
    assert official.report.kept == 400 and sum(official.report.details["allocation"]) == 400
    assert methods.compress_with("unicomp", x, s, (16, 16), ratio=0.1).report.kept == 410


def test_exact_fills_and_caps():
    g = torch.Generator().manual_seed(2)
    # every token of a frame alike: SDC keeps one per frame, the next most unique fill in
    x = torch.randn(8, 1, 12, generator=g) + 0.01 * torch.randn(8, 16, 12, generator=g)
    out = methods.compress_with("unicomp", x, None, (4, 4), ratio=0.25)
    assert out.report.kept == 32 and out.report.details["selected"] == [1] * 8
    assert methods.compress_with("unicomp", x, None, (4, 4), ratio=0.25, exact=False).report.kept == 8
    # identical frames fuse in groups of int(1 / .3) + 1 = 4 -> 4 fused frames of 16 < 77 = M: exact caps the
    # groups at 16 // ceil(77 / 16) = 3 frames (6 fused frames), then compresses to 77
    y = torch.randn(1, 16, 12, generator=g).expand(16, 16, 12).contiguous()
    out = methods.compress_with("unicomp", y, None, (4, 4), ratio=0.3)
    assert out.report.kept == 77 and out.report.details["capped_groups"]
    assert out.report.details["groups"] == [3, 3, 3, 3, 3, 1]
    official = methods.compress_with("unicomp", y, None, (4, 4), ratio=0.3, exact=False)
    assert official.report.details["groups"] == [4, 4, 4, 4] and official.report.kept == 64


def test_frame_features_signal_drives_the_allocation():
    # three distinct frames of 4 dissimilar tokens, r = 0.5: int(6) tokens, cap min(4, 2 * (6 // 3)) = 4 and
    # 3 > 6 // 4, so softmax(uniques) x 6. With SigLIP's frame features e0, e1, e1 the mean similarities
    # are 1/3, 2/3, 2/3, uniques (5/9 - sims) sqrt(3) = .385, -.192, -.192, softmax x 6 = 2.83, 1.59,
    # 1.59: officially floored to 2, 1, 1; exactly 6 by largest remainder: 3, 2, 1 (ties to the lower index)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 16, generator=g)
    first = {"frame_features": torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), "source": "siglip_head"}
    last = {"frame_features": torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])}
    out = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5, signals=first)
    assert out.report.details["signals"] == "siglip_head" and out.report.details["groups"] == [1, 1, 1]
    assert out.report.details["allocation"] == [3, 2, 1] and out.report.details["kept"] == [3, 2, 1]
    official = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5, exact=False, signals=first)
    assert official.report.details["allocation"] == [2, 1, 1]
    # the unique frame last: 1.59, 1.59, 2.83 -> 2, 1, 3 (officially 1, 1, 2)
    out = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5, signals=last)
    assert out.report.details["signals"] == "signals" and out.report.details["allocation"] == [2, 1, 3]
    assert methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5, exact=False,
                                 signals=last).report.details["allocation"] == [1, 1, 2]
    # without the signal: the frames' mean tokens decide
    plain = methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5)
    assert plain.report.details["signals"] == "fallback" and plain.report.details["allocation"] == [2, 2, 2]


def test_frame_features_signal_does_not_fuse():
    # the official fuses frames on their mean tokens (frame_group_fusion), whatever the global features:
    # identical frames fuse with distinct frame features, distinct frames do not with identical ones
    g = torch.Generator().manual_seed(1)
    same = torch.randn(1, 4, 16, generator=g).expand(3, 4, 16).contiguous()
    distinct = {"frame_features": torch.eye(3)}
    assert methods.compress_with("unicomp", same, None, (2, 2), ratio=0.5, exact=False,  # exact would cap the group
                                 signals=distinct).report.details["groups"] == [3]
    x = torch.randn(3, 4, 16, generator=g)
    alike = {"frame_features": torch.ones(3, 2)}
    assert methods.compress_with("unicomp", x, None, (2, 2), ratio=0.5,
                                 signals=alike).report.details["groups"] == [1, 1, 1]


def test_validation():
    with pytest.raises(ValueError, match="uc"):
        methods.make_config("unicomp", uc=-1)
    with pytest.raises(ValueError, match="uf"):
        methods.make_config("unicomp", uf=3)


# ---------------------------------------------------------------------------------------------
# the official code
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("ratio", [0.1, 0.25])
@pytest.mark.parametrize("with_signals", [False, True])
def test_matches_the_official_code(seed, ratio, with_signals):
    official = official_or_skip("unicomp")  # keys replaced as ours does; global features as ours takes them
    g = torch.Generator().manual_seed(seed)
    t, side, d = 24, 10, 32
    n = side * side
    x = torch.randn(1, n, d, generator=g) + 0.02 * torch.randn(t, n, d, generator=g)  # static: frames fuse
    x[8:16] += 1.5 * torch.randn(8, n, d, generator=g)
    x[:, :30] = torch.randn(1, 1, d, generator=g) + 0.05 * torch.randn(t, 30, d, generator=g)  # similar tokens
    frame_features = torch.randn(t, 6, generator=g) if with_signals else None  # SigLIP's pooled output
    signals = {"frame_features": frame_features} if with_signals else None
    want = official(x, None, ratio, frame_features=frame_features)
    ours = methods.compress_with("unicomp", x, None, (side, side), ratio=ratio, exact=False, signals=signals)
    assert ours.features.shape == want.shape
    assert torch.allclose(ours.features, want, atol=1e-6)
    assert len(ours.report.details["groups"]) < t  # frames were fused
    assert ours.report.kept <= math.floor(ratio * t * n)
