"""Budget allocation (Eq. 8) with App. C's overflow redistribution and exact integer totals."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import allocate_budget, allocate_budget_rounds, uniform_budget
from tests.support.reference import budget as ref_budget


def test_softmax_of_negative_difficulty():
    w = torch.tensor([0.1, 0.2, 0.4])
    z = torch.exp(-w / 0.3)
    share = z / z.sum() * 30
    torch.testing.assert_close(share, torch.tensor([14.39, 10.31, 5.29]), atol=0.01, rtol=0)
    # floors 14 + 10 + 5 = 29; the one left goes to the largest remainder (.39, pair 0)
    assert allocate_budget(w, 30, 100, 0.3).tolist() == [15, 10, 5]


def test_largest_remainder_ties_to_lowest_pair():
    assert allocate_budget(torch.zeros(3), 5, 10, 0.3).tolist() == [2, 2, 1]
    assert uniform_budget(4, 6, 10).tolist() == [2, 2, 1, 1]


def test_overflow_is_redistributed_over_pairs_under_cap():
    # pair 0 is far easier: the first softmax gives it ~10 > cap 4; the other 6 are shared again
    budgets, rounds = allocate_budget_rounds(torch.tensor([0.0, 10.0, 10.0]), 10, 4, 0.3)
    assert budgets.tolist() == [4, 3, 3] and rounds == 1


def test_everything_at_cap():
    budgets, rounds = allocate_budget_rounds(torch.tensor([0.0, 5.0, 9.0]), 12, 4, 0.3)
    assert budgets.tolist() == [4, 4, 4]
    assert rounds == 2


def test_zero_total_and_errors():
    assert allocate_budget(torch.rand(4), 0, 3, 0.3).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        allocate_budget(torch.rand(2), 7, 3, 0.3)  # cannot fit
    with pytest.raises(ValueError):
        allocate_budget(torch.tensor([0.1, float("nan")]), 1, 3, 0.3)


@pytest.mark.parametrize("seed", range(10))
def test_matches_literal_procedure(seed):
    g = torch.Generator().manual_seed(seed)
    pairs = int(torch.randint(2, 30, (1,), generator=g))
    cap = int(torch.randint(1, 20, (1,), generator=g))
    total = int(torch.randint(0, pairs * cap + 1, (1,), generator=g))
    w = torch.rand(pairs, generator=g).double() * 2
    budgets, rounds = allocate_budget_rounds(w, total, cap, 0.3)
    assert (budgets.tolist(), rounds) == ref_budget(w.tolist(), total, cap, 0.3)


@settings(max_examples=80, deadline=None)
@given(
    w=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=40),
    cap=st.integers(1, 64),
    fill=st.floats(0.0, 1.0),
    tau=st.floats(0.01, 5.0),
)
def test_sum_and_cap_invariants(w, cap, fill, tau):
    total = math.floor(fill * len(w) * cap)
    budgets, rounds = allocate_budget_rounds(torch.tensor(w), total, cap, tau)
    assert budgets.dtype == torch.long and budgets.shape == (len(w),)
    assert int(budgets.sum()) == total
    assert int(budgets.min()) >= 0 and int(budgets.max()) <= cap
    assert 0 <= rounds <= len(w)
    # easier pairs (smaller W) never get fewer operations than harder ones, up to rounding
    order = sorted(range(len(w)), key=lambda t: w[t])
    got = budgets.tolist()
    assert all(got[order[i]] >= got[order[i + 1]] - 1 for i in range(len(w) - 1))
