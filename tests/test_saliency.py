"""Attention saliency recomputed in query chunks."""

import torch

from ottvid_cli.backbones.saliency import mean_attention_received


def naive(q, k, bounds, scale):
    out = torch.zeros(q.shape[0])
    for a, b in zip(bounds[:-1], bounds[1:]):
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) * scale
        out[a:b] = scores.softmax(-1).mean((0, 1))
    return out


def test_matches_full_softmax_for_equal_and_unequal_segments():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(60, 3, 8, generator=g), torch.randn(60, 3, 8, generator=g)
    for bounds in ([0, 20, 40, 60], [0, 7, 33, 60]):
        got = mean_attention_received(q, k, bounds, 0.35, chunk=6)
        torch.testing.assert_close(got, naive(q, k, bounds, 0.35))
        for a, b in zip(bounds[:-1], bounds[1:]):
            torch.testing.assert_close(got[a:b].sum(), torch.tensor(1.0))


def test_low_precision_inputs_score_in_float32():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(32, 2, 4, generator=g), torch.randn(32, 2, 4, generator=g)
    got = mean_attention_received(q.bfloat16(), k.bfloat16(), [0, 16, 32], 0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, naive(q.bfloat16().float(), k.bfloat16().float(), [0, 16, 32], 0.5))


def test_segments_beyond_the_score_budget_go_in_steps():
    """16 heads x 512 x 512 scores fill the CPU's budget: one segment a step, each still exact."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1536, 16, 8, generator=g), torch.randn(1536, 16, 8, generator=g)
    bounds = [0, 512, 1024, 1536]
    torch.testing.assert_close(mean_attention_received(q, k, bounds, 0.3), naive(q, k, bounds, 0.3))
