"""Batched log-domain Sinkhorn (Eq. 6) and the transport difficulty W_t (Eq. 7)."""

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import marginal_error, sinkhorn, transport_difficulty


def problem(seed, p=4, k=12, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(torch.randn(p, k, generator=g), -1)
    b = torch.softmax(torch.randn(p, k, generator=g), -1)
    c = torch.rand(p, k, k, generator=g) * scale
    return a, b, c


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("absorb", [True, False])
@pytest.mark.parametrize("iters", [1, 7, 200])
def test_matches_pot_sinkhorn_log(seed, absorb, iters):
    # POT checks its own (column, L2) error only every 10 iterations; with a tolerance neither
    # reaches, both run exactly `iters` iterations of the same updates.
    a, b, c = problem(seed, scale=1.0 + seed)
    plan, n = sinkhorn(a, b, c, eps=0.01, max_iter=iters, tol=1e-30, absorb=absorb)
    assert n == iters
    for i in range(a.shape[0]):
        want = ot.sinkhorn(a[i].double().numpy(), b[i].double().numpy(), c[i].double().numpy(), 0.01,
                           method="sinkhorn_log", numItermax=iters, stopThr=1e-30, warn=False)
        # float32 exponents of size C/eps carry a relative error of about C/eps * 1e-7
        np.testing.assert_allclose(plan[i].double().numpy(), want, atol=1e-6, rtol=2e-7 * float(c.max()) / 0.01)


def test_converged_problems_match_pot_plan():
    a, b, c = problem(11, p=3, k=8)
    plan, n = sinkhorn(a, b, c, eps=0.05, max_iter=2000, tol=1e-6)
    assert n < 2000
    for i in range(3):
        want = ot.sinkhorn(a[i].double().numpy(), b[i].double().numpy(), c[i].double().numpy(), 0.05,
                           method="sinkhorn_log", numItermax=5000, stopThr=1e-9, warn=False)
        np.testing.assert_allclose(plan[i].double().numpy(), want, atol=1e-6)


def test_stops_at_first_iteration_below_tol():
    a, b, c = problem(3, p=5, k=10)
    tol = 1e-4
    plan, n, err = sinkhorn(a, b, c, eps=0.1, max_iter=500, tol=tol, returns="error")
    assert 1 < n < 500 and err.max() < tol
    _, _, before = sinkhorn(a, b, c, eps=0.1, max_iter=n - 1, tol=tol, returns="error")
    assert before.max() >= tol  # the batch's largest error decides, not each problem's
    torch.testing.assert_close(err, marginal_error(plan, a, b), atol=2e-6, rtol=0)


def test_batched_equals_one_by_one_when_running_to_max_iter():
    a, b, c = problem(5, p=6, k=9)
    batched = sinkhorn(a, b, c, max_iter=50, tol=1e-30)[0]
    for i in range(6):
        single = sinkhorn(a[i : i + 1], b[i : i + 1], c[i : i + 1], max_iter=50, tol=1e-30)[0]
        torch.testing.assert_close(batched[i : i + 1], single, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("scale", [0.01, 2.0, 50.0])
def test_absorbed_and_direct_agree(scale):
    a, b, c = problem(7, p=8, k=20, scale=scale)
    p1, n1, e1 = sinkhorn(a, b, c, absorb=True, returns="error")
    p2, n2, e2 = sinkhorn(a, b, c, absorb=False, returns="error")
    assert n1 == n2
    # float32 exponents of size C/eps carry a relative error of about C/eps * 1e-7
    torch.testing.assert_close(p1, p2, atol=1e-6, rtol=max(1e-4, 2e-7 * float(c.max()) / 0.01))
    torch.testing.assert_close(e1, e2, atol=1e-6, rtol=1e-3)


def test_difficulty_is_cost_weighted_plan():
    plan = torch.tensor([[[0.5, 0.0], [0.1, 0.4]]])
    cost = torch.tensor([[[0.2, 1.0], [0.5, 0.0]]])
    torch.testing.assert_close(transport_difficulty(plan, cost), torch.tensor([0.5 * 0.2 + 0.1 * 0.5]))


def test_low_precision_inputs_compute_in_float32():
    a, b, c = problem(2)
    plan, _ = sinkhorn(a.half(), b.bfloat16(), c.half())
    assert plan.dtype == torch.float32 and torch.isfinite(plan).all()


def test_shape_errors():
    a, b, c = problem(0)
    with pytest.raises(ValueError):
        sinkhorn(a, b[:, :-1], c)
    with pytest.raises(ValueError):
        sinkhorn(a, b, c[:, :-1])
    with pytest.raises(ValueError):
        sinkhorn(a, b, c, eps=0)


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(1, 5),
    k=st.integers(1, 16),
    scale=st.sampled_from([0.0, 1e-3, 1.0, 2.0, 30.0, 1e4]),
    eps=st.sampled_from([0.005, 0.01, 0.1, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_finite_and_marginals(p, k, scale, eps, seed):
    a, b, c = problem(seed, p=p, k=k, scale=scale)
    plan, n, err = sinkhorn(a, b, c, eps=eps, max_iter=200, tol=1e-5, returns="error")
    assert torch.isfinite(plan).all() and torch.isfinite(err).all()
    assert plan.shape == (p, k, k) and 1 <= n <= 200 and torch.all(plan >= 0)
    # rows always sum to a after the row update; columns to b when converged. float32 exponents of
    # size C/eps carry a relative error of about C/eps * 1e-7.
    rtol = 1e-5 + 4e-7 * float(c.max()) / eps
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-5, rtol=rtol)
    if n < 200:
        torch.testing.assert_close(plan.sum(-2), b, atol=2e-5, rtol=rtol)


@pytest.mark.parametrize("tol", [1e-30, 1e-3])
@pytest.mark.parametrize("absorb", [False, True])
def test_checking_every_10_iterations_gives_the_same_result(tol, absorb):
    """The GPU schedule (host checks every 10 iterations, converged state frozen on the device)."""
    a, b, c = problem(9, p=5, k=10)
    every_one = sinkhorn(a, b, c, eps=0.1, max_iter=57, tol=tol, absorb=absorb, check_every=1, returns="error")
    every_ten = sinkhorn(a, b, c, eps=0.1, max_iter=57, tol=tol, absorb=absorb, check_every=10, returns="error")
    assert every_one[1] == every_ten[1]
    if tol == 1e-3:
        assert every_one[1] < 57 and every_one[1] % 10 != 0  # converged between two host checks
    assert torch.equal(every_one[0], every_ten[0]) and torch.equal(every_one[2], every_ten[2])


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_cancelled_run_stops_between_iterations(early_stop):
    """`sinkhorn_stop=fixed, max_iter=10**12` stops when cancelled (it ran for years past its request's timeout)."""
    import threading

    from ottvid_cli.interrupt import Interrupted, stop_when

    a, b, cost = problem(0)
    calls = []

    def cancel():  # says stop at its fifth question
        calls.append(1)
        return len(calls) >= 5

    with stop_when(cancel), pytest.raises(Interrupted, match="Sinkhorn"):
        sinkhorn(a, b, cost, 0.01, 10**12, 1e-30, early_stop=early_stop, check_every=1, returns="error")
    assert len(calls) == 5
    with stop_when(threading.Event()):  # never set: the run is the usual one
        plan, iterations, _ = sinkhorn(a, b, cost, 0.01, 50, 1e-30, early_stop=early_stop, returns="error")
    assert iterations == 50 and torch.isfinite(plan).all()
