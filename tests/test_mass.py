"""Transport mass (Eq. 2-3 and the App. B.1 variants)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import select_tokens, token_mass
from tests.support.reference import mass as ref_mass


def test_eq2_eq3_by_hand():
    r = 1 / math.sqrt(2)
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [r, r]]])
    w = torch.tensor([[0.5, 0.25, 0.25]])
    selected = torch.tensor([[0, 2]])
    # u_0 = .5 * (1 - .707) (token 0); u_1 = .25 * .707 (token 1) + .25 * (1 - .707) (token 2) = .25
    u = np.array([0.5 * (1 - r), 0.25])
    e = np.exp(-(u / u.max()) / 0.3)
    expected = e / e.sum()
    got = token_mass(x, w, selected, 0.3)
    np.testing.assert_allclose(got[0].numpy(), expected, rtol=1e-5)
    assert got[0, 0] > got[0, 1]  # the more irreplaceable token gets the smaller mass


@pytest.mark.parametrize("seed", range(5))
def test_matches_literal_equation(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 16, 5, generator=g)
    w = torch.rand(3, 16, generator=g)
    selected = select_tokens(x, w, 6)
    got = token_mass(x, w, selected, 0.3)
    for t in range(3):
        want = ref_mass(x[t].double().numpy(), w[t].double().numpy(), selected[t].tolist(), 0.3)
        np.testing.assert_allclose(got[t].numpy(), want, rtol=1e-4, atol=1e-6)


def test_single_token_has_mass_one():
    x = torch.randn(2, 4, 3)
    assert torch.equal(token_mass(x, torch.rand(2, 4), torch.tensor([[1], [3]]), 0.3), torch.ones(2, 1))


def test_zero_contribution_gives_uniform_mass():
    x = torch.ones(1, 5, 3)  # sigma_1 == sigma_2 everywhere
    got = token_mass(x, torch.rand(1, 5), torch.tensor([[0, 2, 4]]), 0.3)
    assert torch.allclose(got, torch.full((1, 3), 1 / 3))


def test_temperature_sharpens():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 30, 8, generator=g), torch.rand(1, 30, generator=g)
    sel = select_tokens(x, w, 8)
    cold, warm = token_mass(x, w, sel, 0.1), token_mass(x, w, sel, 3.0)
    assert cold.max() / cold.min() > warm.max() / warm.min()


@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 4),
    n=st.integers(2, 20),
    d=st.integers(1, 6),
    frac=st.floats(0.05, 1.0),
    tau=st.floats(0.05, 2.0),
    method=st.sampled_from(["coverage", "saliency", "divprune", "adts", "scope"]),
    seed=st.integers(0, 2**16),
)
def test_masses_are_distributions(t, n, d, frac, tau, method, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, d, generator=g)
    w = torch.rand(t, n, generator=g)
    k = max(1, min(n, round(frac * n)))
    sel = select_tokens(x, w, k, method=method)
    m = token_mass(x, w, sel, tau, method=method)
    assert m.shape == (t, k) and m.dtype == torch.float32
    assert torch.all(m > 0)
    torch.testing.assert_close(m.sum(-1), torch.ones(t), rtol=0, atol=1e-5)
