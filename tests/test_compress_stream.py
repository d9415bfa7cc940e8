"""OTT-Vid fed chunk by chunk (compression.stream.OTTVidStream) makes the decisions `compress` makes on the
whole tensor: the same index, assignment, spatial selection, budgets, merges, prunes and report, and
the same features bit for bit, wherever the chunk boundaries fall (inside merge chains too)."""

from __future__ import annotations

import pytest
import torch

from ottvid_cli.compression import OTTVidConfig, compress, token_counts
from ottvid_cli.compression.stream import OTTVidStream


def video(t=12, h=4, w=4, d=16, seed=0, drift=0.3, dtype=torch.float32):
    """Correlated groups (a scene plus noise) with non-uniform saliency."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, h * w, d, generator=g)
    x = base + drift * torch.randn(t, h * w, d, generator=g)
    return x.to(dtype), torch.rand(t, h * w, generator=g), (h, w)


def streamed(features, saliency, grid, config, sizes, extra=()):
    stream = OTTVidStream(features.shape[0], grid, config)
    start = 0
    for size in sizes:
        stream.add(features[start:start + size], saliency[start:start + size],
                   [e[start:start + size] for e in extra])
        start += size
    assert start == features.shape[0]
    return stream.finish()


def assert_same(got, want):
    assert torch.equal(got.index, want.index)
    assert torch.equal(got.assignment, want.assignment)
    assert torch.equal(got.selected, want.selected)
    assert got.features.dtype == want.features.dtype
    assert torch.equal(got.features, want.features)  # bit for bit
    a, b = got.report.to_dict(), want.report.to_dict()
    a.pop("timings_ms"), b.pop("timings_ms")
    assert a == b


SPLITS = [[1] * 12, [2] * 6, [5, 7], [3, 4, 5], [11, 1], [1, 11], [12]]


@pytest.mark.parametrize("sizes", SPLITS)
def test_chunks_give_compress_decisions_and_features(sizes):
    x, s, grid = video()
    want = compress(x, s, grid, OTTVidConfig(ratio=0.2))
    assert sum(want.report.merges) > 0 and sum(want.report.prunes) >= 0
    assert_same(streamed(x, s, grid, OTTVidConfig(ratio=0.2), sizes), want)


@pytest.mark.parametrize("config", [
    OTTVidConfig.official(ratio=0.15),
    OTTVidConfig(ratio=0.1, budget="uniform"),
    OTTVidConfig(ratio=0.25, mass="uniform"),
    OTTVidConfig(ratio=0.2, alpha="kernel"),
    OTTVidConfig(ratio=0.2, alpha="global"),
    OTTVidConfig(ratio=0.2, alpha=0.75),
    OTTVidConfig(ratio=0.2, spatial="saliency"),
    OTTVidConfig(ratio=0.2, spatial="divprune"),
    OTTVidConfig(ratio=0.2, spatial="adts"),
    OTTVidConfig(ratio=0.2, spatial="scope"),
    OTTVidConfig(ratio=0.3, sinkhorn_stop="fixed", max_iter=40),
], ids=lambda c: f"{c.ratio}")
def test_every_switch_streams_identically(config):
    x, s, grid = video(seed=3)
    assert_same(streamed(x, s, grid, config, [3, 4, 5]), compress(x, s, grid, config))


def test_a_chunk_boundary_inside_merge_chains():
    """A nearly static scene: chains run through every group, so each boundary cuts through chains."""
    x, s, grid = video(t=10, drift=0.002, seed=1)
    s = s[:1].expand(10, -1).contiguous()  # the same saliency: each group selects the same places
    config = OTTVidConfig(ratio=0.2)
    want = compress(x, s, grid, config)
    n = grid[0] * grid[1]
    group_of = torch.arange(10 * n) // n
    root_group = group_of[want.index[want.assignment.clamp_min(0)]]
    crossing = (want.assignment >= 0) & (group_of >= 4) & (root_group < 4)  # merged across the 3 | 4 boundary
    assert bool(crossing.any())
    assert_same(streamed(x, s, grid, config, [4, 6]), want)
    assert_same(streamed(x, s, grid, config, [1, 3, 2, 4]), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes(dtype):
    x, s, grid = video(dtype=dtype)
    config = OTTVidConfig(ratio=0.15)
    assert_same(streamed(x, s, grid, config, [5, 7]), compress(x, s, grid, config))


def test_ratio_one_and_a_single_group():
    x, s, grid = video(t=6)
    assert_same(streamed(x, s, grid, OTTVidConfig(ratio=1.0), [2, 4]), compress(x, s, grid, OTTVidConfig(ratio=1.0)))
    one = OTTVidStream(1, grid, OTTVidConfig(ratio=0.25))
    one.add(x[:1], s[:1])
    assert_same(one.finish(), compress(x[:1], s[:1], grid, OTTVidConfig(ratio=0.25)))


def test_other_per_token_tensors_are_merged_as_apply_merges_them():
    x, s, grid = video(t=8)
    g = torch.Generator().manual_seed(7)
    deep = [torch.randn(8, 16, 5, generator=g), torch.randn(8, 16, 3, generator=g).to(torch.bfloat16)]
    config = OTTVidConfig(ratio=0.2)
    got = streamed(x, s, grid, config, [3, 5], extra=deep)
    want = compress(x, s, grid, config)
    assert_same(got, want)
    merged = got.extra["merged"]
    assert len(merged) == 2
    for rows, layer in zip(merged, deep):
        assert torch.equal(rows, want.apply(layer.reshape(8 * 16, -1)))
    every = streamed(x, s, grid, OTTVidConfig(ratio=1.0), [2, 6], extra=deep)
    for rows, layer in zip(every.extra["merged"], deep):
        assert torch.equal(rows, every.apply(layer.reshape(8 * 16, -1)))


def test_held_memory_follows_the_kept_tokens_not_the_video():
    t, h, w, d = 40, 8, 8, 64
    x, s, grid = video(t=t, h=h, w=w, d=d)
    config = OTTVidConfig(ratio=0.1)
    k = token_counts(t, h * w, 0.1, config.gamma).K
    stream = OTTVidStream(t, grid, config)
    for start in range(0, t, 4):
        stream.add(x[start:start + 4], s[start:start + 4])
    whole = x.numel() * x.element_size()
    # the selected tokens, their masses and positions, and the pairs' K x K costs; the last group carried
    assert stream.nbytes <= t * k * (d * 4 + 8 + 4) + (t - 1) * (k * k * 4 + 4) + (h * w * (d + 1) + k * (d + 4)) * 4
    assert stream.nbytes < whole / 2


def test_misuse_is_refused_in_one_line():
    x, s, grid = video(t=4)
    stream = OTTVidStream(4, grid)
    stream.add(x[:2], s[:2])
    with pytest.raises(ValueError, match="2 of 4 groups were added"):
        stream.finish()
    with pytest.raises(ValueError, match="more than the 4 announced"):
        stream.add(x[:3], s[:3])
    with pytest.raises(ValueError, match="first's device, dtype and width"):
        stream.add(x[2:].double(), s[2:])
    with pytest.raises(ValueError, match="holds N = 16 tokens"):
        stream.add(x[2:, :8], s[2:, :8])
    bad = x[2:].clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        stream.add(bad, s[2:])
    with pytest.raises(ValueError, match="non-negative"):
        stream.add(x[2:], -s[2:])
    with pytest.raises(ValueError, match="groups must be a whole number"):
        OTTVidStream(0, grid)
