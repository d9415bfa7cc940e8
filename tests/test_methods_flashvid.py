"""FlashVID (ottvid_cli/compression/methods/flashvid.py): hand-computed steps, counts, the official code.

The official comparison imports flashvid/utils.py of Fanziyang-v/FlashVID (with token_selection.py and
configuration_flashvid.py, which need only torch) from a clone of it under
benchmarks/methods.py's MIRROR ($OTTVID_MIRROR, by default ~/.cache/ottvid/mirror), and skips without it.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_methods import official_or_skip

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.flashvid import FlashVIDConfig, adts, segment_frames
from ottvid_cli.compression.spatial import gram_cosine


def unit(angles):
    a = torch.tensor(angles, dtype=torch.float64)
    return torch.stack((a.cos(), a.sin()), -1).float()


def test_segments_by_hand():
    # consecutive frame-mean cosines 0.95, 0.5, 0.99, 0.92
    angles = [0.0]
    for c in (0.95, 0.5, 0.99, 0.92):
        angles.append(angles[-1] + math.acos(c))
    means = unit(angles)
    assert segment_frames(means, FlashVIDConfig(min_segments=1)) == [2, 3]  # cut below 0.9 only
    assert segment_frames(means, FlashVIDConfig(min_segments=3)) == [2, 2, 1]  # + the least similar other: 0.92
    assert segment_frames(means, FlashVIDConfig(min_segments=8)) == [1, 1, 1, 1, 1]  # never a repeated cut
    assert segment_frames(means, FlashVIDConfig(min_segments=3, complementary=False)) == [2, 3]
    assert segment_frames(means, FlashVIDConfig(do_segment=False)) == [5]


def test_adts_by_hand():
    # tokens a = e0, b = e1, c = (e0 + e1) / sqrt 2: 1 - cos is 1 (a, b) and .29 (with c)
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.7071068, 0.7071068]]])
    sim, _ = gram_cosine(x)
    # weights 1, 2, 1: columns scale to a [0, 1, .29], b [2, 0, .59], c [.29, .29, 0]; the first pick maximises
    # the second smallest of its column (b, .59), the next the distance to the picks (a: 1 > c: .29)
    picked, repeats = adts(sim, torch.tensor([[1.0, 2.0, 1.0]]), torch.tensor([2]), exclude=True)
    assert picked.tolist() == [[True, True, False]] and repeats.tolist() == [0]
    # a negative calibration (v2's event relevance can be negative): without exclusion the argmax falls
    # back on an already picked token (score 0 > -.29): the official v2 re-pick
    weight = torch.tensor([[1.0, 1.0, -1.0]])
    picked, repeats = adts(sim, weight, torch.tensor([3]), exclude=True)
    assert picked.tolist() == [[True, True, True]] and repeats.tolist() == [0]
    picked, repeats = adts(sim, weight, torch.tensor([3]), exclude=False)
    assert picked.tolist() == [[True, True, False]] and repeats.tolist() == [1]


def chain_video():
    """4 frames of a 2 x 2 grid in 16 dims: token 0 drifts slowly (a 4-frame merge chain), tokens 1 and 2
    are new every frame, token 3 is the salient one ADTS keeps."""
    x = torch.zeros(4, 4, 16)
    for t in range(4):
        x[t, 0, 0], x[t, 0, 14] = 1.0, 0.1 * t
        x[t, 1, 1 + 2 * t] = 1.0
        x[t, 2, 2 + 2 * t] = 1.0
        x[t, 3, 15] = 1.0
    s = torch.tensor([[0.01, 0.01, 0.01, 1.0]]).expand(4, 4)
    return x, s


def test_tree_averaging_and_counts_by_hand():
    x, s = chain_video()
    # ratio .5, alpha .5: budget ceil(4 * .5) = 2, ADTS ceil(2 * .5) = 1 (token 3), STTM 1 per frame.
    # TSTM: token 0 of frames 1-3 merges into the previous frame's token 0 (cos > .8); nothing else does.
    # Trees left: frame 0: 0, 1, 2; frames 1-3: 1, 2 -> 9; clusters: 4 over them.
    # exact: 4 * [3, 2, 2, 2] / 9 by largest remainder -> 1 per frame -> 4 ADTS + 4 = 8 = round(.5 * 16)
    out = methods.compress_with("flashvid", x, s, (2, 2), ratio=0.5, alpha=0.5, do_segment=False)
    d = out.report.details
    assert d["segments"] == [4] and d["merged"] == 3 and d["clusters"] == [1, 1, 1, 1] and out.report.kept == 8
    chain = x[:, 0].mean(0)  # the tree of token 0: its mean
    row = int(out.assignment[0])
    want = (chain + x[0, 1] + x[0, 2]) / 3  # frame 0's single cluster: the mean of its three trees
    assert torch.allclose(out.features[row], want)
    assert out.assignment[[0, 4, 8, 12]].tolist() == [row] * 4  # the chain follows its tree
    assert torch.equal(out.features[out.assignment[3]], x[0, 3])  # ADTS tokens: as they are
    # official counts: ceil(3 * 4/9) = 2 in frame 0, ceil(2 * 4/9) = 1 elsewhere -> 9
    out = methods.compress_with("flashvid", x, s, (2, 2), ratio=0.5, alpha=0.5, do_segment=False, exact=False)
    assert out.report.details["clusters"] == [2, 1, 1, 1] and out.report.kept == 9
    # bug_compatible: the chain's value is sum / (1 + direct children) = 4 * mean / 2; DPC then leaves it alone
    out = methods.compress_with("flashvid", x, s, (2, 2), ratio=0.5, alpha=0.5, do_segment=False, exact=False,
                                bug_compatible=True)
    assert torch.allclose(out.features[out.assignment[0]], x[:, 0].sum(0) / 2)
    assert 0 in out.index.tolist()


def test_single_frame_segment_duplicates():
    """Officially a single-frame segment clusters all N tokens, ADTS ones included, so a DPC centre can
    sit on an ADTS token: two tokens at one position. bug_compatible collapses them and counts them."""
    x = torch.zeros(1, 6, 16)
    x[0, 0, 15] = 1.0  # the salient token ADTS keeps, in the middle of a tight cluster
    x[0, 1, 15], x[0, 1, 0] = 1.0, 0.1
    x[0, 2, 15], x[0, 2, 1] = 1.0, 0.1
    for n, e in ((3, 2), (4, 3), (5, 4)):
        x[0, n, e] = 1.0
    s = torch.tensor([[1.0, 0, 0, 0, 0, 0]])
    # budget ceil(6 * .5) = 3, ADTS ceil(3 * .3) = 1, 2 clusters
    out = methods.compress_with("flashvid", x, s, (2, 3), ratio=0.5, alpha=0.3, exact=False, bug_compatible=True)
    assert out.report.details["duplicates"] == 1 and out.report.details["official_count"] == 3
    assert out.report.kept == 2 and out.index.tolist() == [0, 3]
    assert torch.equal(out.features[0], x[0, 0])  # the collapsed position keeps the ADTS token
    out = methods.compress_with("flashvid", x, s, (2, 3), ratio=0.5, alpha=0.3, exact=False)
    assert out.report.details["duplicates"] == 0 and out.report.kept == 3 and 0 in out.index.tolist()


def test_counts_at_paper_shape():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 256, 32, generator=g) + 0.7 * torch.randn(16, 256, 32, generator=g)
    s = torch.rand(16, 256, generator=g)
    assert methods.compress_with("flashvid", x, s, (16, 16), ratio=0.1).report.kept == 410
    official = methods.compress_with("flashvid", x, s, (16, 16), ratio=0.1, exact=False)
    assert official.report.kept == official.report.details["official_count"] >= 16 * math.ceil(25.6)


def test_validation():
    with pytest.raises(ValueError, match="selection"):
        methods.make_config("flashvid", selection="attn")
    with pytest.raises(ValueError, match="temporal_threshold"):
        methods.make_config("flashvid", temporal_threshold=1.0)
    with pytest.raises(ValueError, match="exact=False"):
        methods.make_config("flashvid", bug_compatible=True)


# ---------------------------------------------------------------------------------------------
# the official code
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("selection", ["attn_div_v2", "attn_div"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_official_code(selection, seed, monkeypatch):
    official = official_or_skip("flashvid")
    g = torch.Generator().manual_seed(seed)
    t, side, d = 12, 6, 24
    base = torch.randn(1, side * side, d, generator=g)
    x = base + 0.6 * torch.randn(t, side * side, d, generator=g)
    x[:, :18] = base[:, :18] + 0.05 * torch.randn(t, 18, d, generator=g)
    x[t // 2:] += 0.8 * torch.randn(1, side * side, d, generator=g)
    s = torch.rand(t, side * side, generator=g)
    # the official density noise (rand_like * 1e-6) as our deterministic tie-break: lower index first
    monkeypatch.setattr(torch, "rand_like", lambda a, **kw: -a * torch.arange(a.shape[-1], dtype=a.dtype))
    index, tokens = official(x, s, 0.2, selection=selection)  # sorted by position, repeats kept
    monkeypatch.undo()
    ours = methods.compress_with("flashvid", x, s, (side, side), ratio=0.2, selection=selection, exact=False,
                                 bug_compatible=True)
    d = ours.report.details
    assert ours.report.kept + d["duplicates"] + d["repicks"] == index.numel() == d["official_count"]
    assert torch.equal(ours.index, torch.unique(index))
    once = torch.bincount(index, minlength=t * side * side)[ours.index] == 1  # positions emitted once
    order = index.argsort(stable=True)
    rows = torch.searchsorted(index[order], ours.index[once])
    assert torch.allclose(ours.features[once], tokens[order][rows], atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the vectorised steps against straightforward per-frame / per-tree references
# ---------------------------------------------------------------------------------------------

def reference_parent(x, adts_mask, lengths, threshold):
    """TSTM's candidate merges frame by frame (before the soft threshold): the most similar non-ADTS token
    of the previous frame of the same segment, by cosine, kept when above `threshold`."""
    t, n, _ = x.shape
    parent = torch.arange(t * n)
    start = 0
    for length in lengths:
        for f in range(start + 1, start + length):
            a = x[f] / x[f].norm(dim=-1, keepdim=True)
            b = x[f - 1] / x[f - 1].norm(dim=-1, keepdim=True)
            cos = a @ b.T
            cos[adts_mask[f]] = -1.0
            cos[:, adts_mask[f - 1]] = -1.0
            value, where = cos.max(-1)
            for i in range(n):
                if value[i] > threshold:
                    parent[f * n + i] = (f - 1) * n + where[i]
        start += length
    return parent


@pytest.mark.parametrize("seed", range(3))
def test_tstm_matches_a_per_frame_reference(seed):
    from ottvid_cli.compression.methods.flashvid import tstm

    g = torch.Generator().manual_seed(seed)
    t, n, d = 9, 12, 8
    x = torch.randn(1, n, d, generator=g) + 0.4 * torch.randn(t, n, d, generator=g)
    adts_mask = torch.rand(t, n, generator=g) < 0.2
    lengths = [3, 1, 4, 1]
    seg_of = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    first = torch.ones(t, dtype=torch.bool)
    first[1:] = seg_of[1:] != seg_of[:-1]
    _, inv_norm = gram_cosine(x)
    parent = tstm(x, inv_norm, adts_mask, first, seg_of, [0] * 4, lengths, 0.7)  # lower bound 0: no soft threshold
    assert torch.equal(parent, reference_parent(x, adts_mask, lengths, 0.7))


def test_tree_values_match_per_tree_means():
    from ottvid_cli.compression.methods.flashvid import tree_values

    g = torch.Generator().manual_seed(0)
    flat = torch.randn(12, 5, generator=g)
    # chains 0 <- 4 <- 8 and 1 <- 5, token 2 alone, 3 dropped (no tree), the rest alone
    parent = torch.arange(12)
    parent[4], parent[8], parent[5] = 0, 4, 1
    root_of = parent[parent]
    tree_root = torch.tensor([0, 1, 2, 6, 7, 9, 10, 11])
    tree_id = torch.full((12,), -1)
    tree_id[tree_root] = torch.arange(8)
    target = tree_id[root_of]
    joined = root_of != torch.arange(12)
    values, size = tree_values(flat, tree_root, target, joined, None)
    assert size.tolist() == [3, 2, 1, 1, 1, 1, 1, 1]
    torch.testing.assert_close(values[0], flat[[0, 4, 8]].mean(0))
    torch.testing.assert_close(values[1], flat[[1, 5]].mean(0))
    assert torch.equal(values[2:], flat[[2, 6, 7, 9, 10, 11]])  # single tokens: bit for bit
    values, size = tree_values(flat, tree_root, target, joined, parent)  # official: sum / (1 + direct children)
    assert size.tolist()[:2] == [2, 2]
    torch.testing.assert_close(values[0], flat[[0, 4, 8]].sum(0) / 2)


def test_width_buckets():
    from ottvid_cli.compression.methods.flashvid import width_buckets

    assert width_buckets([100, 90, 30, 81, 5, 12, 79], floor=16) == [([0, 1, 3], 100), ([6], 79), ([2], 30),
                                                                     ([4, 5], 16)]
    assert width_buckets([3, 5, 1], floor=5) == [([0, 1, 2], 5)]


@pytest.mark.parametrize("seed", range(3))
def test_frame_clusters_match_one_frame_at_a_time(seed):
    """The padded, width-bucketed DPC-kNN gives each frame what DPC-kNN on that frame's trees alone gives."""
    from ottvid_cli.compression.methods.flashvid import frame_clusters
    from ottvid_cli.compression.methods.holitom import dpc_knn, pairwise_distances

    g = torch.Generator().manual_seed(seed)
    n_kept = [40, 3, 0, 25, 38, 17, 1, 12]
    clusters = [5, 2, 0, 4, 0, 3, 1, 12]
    values = torch.randn(sum(n_kept), 16, generator=g)
    centre, joins = frame_clusters(values, n_kept, clusters)
    start = 0
    for n, c in zip(n_kept, clusters):
        rows = slice(start, start + n)
        if c == 0:
            assert not centre[rows].any() and (joins[rows] == -1).all()
        else:
            one, own = dpc_knn(pairwise_distances(values[rows][None]), torch.ones(1, n, dtype=torch.bool),
                               torch.tensor([c]), torch.tensor([min(c, 7)]), order="score")
            assert torch.equal(centre[rows], one[0]) and torch.equal(joins[rows], own[0] + start)
        start += n
