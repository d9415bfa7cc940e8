"""Transport cost and the mixing weight alpha_t (Eq. 4-5)."""

import math

import numpy as np
import pytest
import torch

from ottvid_cli.compression import mixing_weight, transport_cost
from ottvid_cli.compression.transport import colocated_dots, grid_positions
from tests.support.reference import alpha as ref_alpha
from tests.support.reference import cost as ref_cost


def test_alpha_bounds_static_and_opposite():
    x = torch.randn(1, 6, 4)
    static = torch.cat([x, x, -x])  # identical pair, then anti-correlated pair
    a = mixing_weight(static, (2, 3))
    torch.testing.assert_close(a, torch.tensor([0.5, 1.0]))


@pytest.mark.parametrize("seed", range(3))
def test_alpha_position_matches_literal(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, 12, 5, generator=g)
    x = base + 0.7 * torch.randn(4, 12, 5, generator=g)  # positively correlated groups
    got = mixing_weight(x, (3, 4))
    want = [ref_alpha(x[t].double().numpy(), x[t + 1].double().numpy()) for t in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    assert torch.all((got >= 0.5) & (got <= 1.0))


def test_alpha_variants():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, 4, generator=g) + torch.randn(1, 16, 4, generator=g)
    assert torch.equal(mixing_weight(x, (4, 4), 0.75), torch.full((2,), 0.75))
    means = x.mean(1)
    s_bar = torch.nn.functional.cosine_similarity(means[:-1], means[1:], dim=-1)
    torch.testing.assert_close(mixing_weight(x, (4, 4), "global"), 1 - s_bar.clamp(0, 1) / 2)
    # kernel: co-located cosine of 3x3 window means (valid windows only: 2x2 of them on a 4x4 grid)
    maps = x.view(3, 4, 4, 4)
    pooled = torch.stack([maps[:, r : r + 3, c : c + 3].mean((1, 2)) for r in range(2) for c in range(2)], 1)
    s_bar = torch.nn.functional.cosine_similarity(pooled[:-1], pooled[1:], dim=-1).mean(-1)
    torch.testing.assert_close(mixing_weight(x, (4, 4), "kernel"), 1 - s_bar.clamp(0, 1) / 2)
    assert mixing_weight(x[:1], (4, 4)).shape == (0,)


def test_colocated_dots_blocks_match_direct():
    x = torch.randn(9, 300, 40)  # several blocks of the internal buffer
    torch.testing.assert_close(colocated_dots(x), (x[:-1] * x[1:]).sum(-1), rtol=1e-5, atol=1e-4)


def test_cost_by_hand():
    # grid 2 x 2, d_max = sqrt(2). Two tokens per group.
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]]])
    positions = grid_positions(torch.tensor([[0, 3], [0, 3]]), (2, 2))
    c = transport_cost(x, positions, torch.tensor([0.5]), (2, 2))
    r = 1 / math.sqrt(2)
    expected = torch.tensor([[0.5 * 0 + 0.5 * 0, 0.5 * (1 - r) + 0.5 * 1], [0.5 * 1 + 0.5 * 1, 0.5 * (1 - r) + 0.5 * 0]])
    torch.testing.assert_close(c[0], expected)


@pytest.mark.parametrize("seed", range(3))
def test_cost_matches_literal(seed):
    g = torch.Generator().manual_seed(seed)
    grid = (3, 5)
    x = torch.randn(3, 15, 4, generator=g)
    sel = torch.stack([torch.randperm(15, generator=g)[:6].sort().values for _ in range(3)])
    chosen = torch.stack([x[t, sel[t]] for t in range(3)])
    alpha = torch.tensor([0.6, 0.9])
    got = transport_cost(chosen, grid_positions(sel, grid), alpha, grid)
    for t in range(2):
        want = ref_cost(x[t].numpy(), x[t + 1].numpy(), sel[t].tolist(), sel[t + 1].tolist(), grid, float(alpha[t]))
        np.testing.assert_allclose(got[t].numpy(), want, rtol=1e-5, atol=1e-6)


def test_single_token_grid_has_no_location_cost():
    x = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    c = transport_cost(x, grid_positions(torch.zeros(2, 1, dtype=torch.long), (1, 1)), torch.tensor([0.5]), (1, 1))
    torch.testing.assert_close(c, torch.tensor([[[0.5]]]))
