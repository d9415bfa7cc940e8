"""Fused Triton kernels for OTT-Vid's two iterative stages (imported only where `triton` imports).

- Sinkhorn (paper Eq. 6): one program per frame pair holds its K x K log-kernel in registers and
  runs the log-domain iterations in place; all pairs, all iterations in ceil(max_iter / chunk) + 1
  launches with the tolerance checked on the device (one launch when the iteration count is fixed).
- Greedy coverage selection (Eq. 1 and SCOPE): one program per group runs all k greedy steps.

Kernels are built (triton.jit) on first use, separately for Triton's interpreter
(TRITON_INTERPRET=1, CPU tensors, how the tests run them) and for compiled GPU code. Both compute
the same float32 updates, in the same order, as the PyTorch path in transport.py / spatial.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ..interrupt import checkpoint


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter: TRITON_INTERPRET=1 was set before `triton` was
    imported (Triton builds its own language functions for one mode or the other at import)."""
    return type(tl.max).__name__ == "InterpretedFunction"


# exp() arguments below this are clamped, as in transport.py (no effect on a float32 sum).
_EXP_FLOOR = tl.constexpr(-80.0)
# Largest K x K problem one program holds in registers (K <= 256); larger ones use PyTorch.
MAX_BLOCK = 256
# Iterations per launch while the tolerance decides when to stop.
CHUNK = 10


def _sinkhorn_iterations(
    cost_ptr, loga_ptr, logb_ptr, a_ptr, b_ptr, state_ptr, err_ptr, halted_ptr, stop_ptr, plan_ptr, out_ptr,
    pairs, k, neg_eps, tol, done, steps, previous, max_iter, chunk,
    BLOCK: tl.constexpr, PBLOCK: tl.constexpr, CBLOCK: tl.constexpr, EARLY: tl.constexpr, FINISH: tl.constexpr,
):
    """Iterations of one pair's log-domain Sinkhorn (program id = pair).

    Advance (FINISH false): `steps` iterations from the state after `done` iterations, the marginal
    error of each written to err[pair, t]; first, if the batch's largest error fell below tol
    within the previous `previous` iterations, the pair halts instead (every later launch too).
    Finish: the stop iteration t* is read from stop_ptr, the state is rebuilt from the start of
    its chunk (the same updates, so the same numbers), then the plan, the error and W are written.
    State slots: state[slot, 0 / 1 / 2, pair] = f, g, g_next, slot = (iterations // chunk) % 2.
    """
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    valid = offs < k
    mask2 = valid[:, None] & valid[None, :]
    base = pid.to(tl.int64) * k * k
    cost = tl.load(cost_ptr + base + offs[:, None] * k + offs[None, :], mask=mask2, other=0.0)
    log_kernel = tl.where(mask2, cost / neg_eps, float("-inf"))  # M = -C / eps
    log_a = tl.load(loga_ptr + pid * k + offs, mask=valid, other=0.0)
    log_b = tl.load(logb_ptr + pid * k + offs, mask=valid, other=0.0)
    a = tl.load(a_ptr + pid * k + offs, mask=valid, other=0.0)
    b = tl.load(b_ptr + pid * k + offs, mask=valid, other=0.0)
    slot_size = 3 * pairs * BLOCK

    start = done
    if FINISH:
        t_star = tl.load(stop_ptr)
        start = ((t_star - 1) // chunk) * chunk
        steps = t_star - start
        run = t_star > 0
    else:
        run = tl.load(halted_ptr + pid) == 0
        if EARLY:
            if done > 0:
                # Did the batch's largest marginal error fall below tol in the previous chunk?
                t_off = tl.arange(0, CBLOCK)
                t_mask = t_off < previous
                worst = tl.zeros([CBLOCK], dtype=tl.float32)
                for p0 in range(0, pairs, PBLOCK):
                    p_off = p0 + tl.arange(0, PBLOCK)
                    e = tl.load(err_ptr + p_off[:, None] * max_iter + (done - previous + t_off)[None, :],
                                mask=(p_off < pairs)[:, None] & t_mask[None, :], other=0.0)
                    worst = tl.maximum(worst, tl.max(e, axis=0))
                converged = tl.sum(tl.where(t_mask & (worst < tol), 1, 0), axis=0) > 0
                tl.store(halted_ptr + pid, 1, mask=run & converged)
                run = run & (converged == 0)

    if run:
        src = state_ptr + ((start // chunk) % 2) * slot_size + pid * BLOCK + offs
        f = tl.zeros([BLOCK], dtype=tl.float32)
        g = tl.zeros([BLOCK], dtype=tl.float32)
        if start == 0:
            # the first iteration's column update, from f = 0
            x = log_kernel + f[:, None]
            peak = tl.max(x, axis=0)
            e = tl.where(mask2, tl.exp(tl.maximum(x - peak[None, :], _EXP_FLOOR)), 0.0)
            g_next = tl.where(valid, log_b - (tl.log(tl.sum(e, axis=0)) + peak), 0.0)
        else:
            f = tl.load(src)
            g = tl.load(src + pairs * BLOCK)
            g_next = tl.load(src + 2 * pairs * BLOCK)
        for step in range(steps):
            g = g_next
            # f_i = log a_i - LSE_j(M_ij + g_j)
            x = log_kernel + g[None, :]
            peak = tl.max(x, axis=1)
            e = tl.where(mask2, tl.exp(tl.maximum(x - peak[:, None], _EXP_FLOOR)), 0.0)
            f = tl.where(valid, log_a - (tl.log(tl.sum(e, axis=1)) + peak), 0.0)
            # g'_j = log b_j - LSE_i(M_ij + f_i)
            x = log_kernel + f[:, None]
            peak = tl.max(x, axis=0)
            e = tl.where(mask2, tl.exp(tl.maximum(x - peak[None, :], _EXP_FLOOR)), 0.0)
            g_next = tl.where(valid, log_b - (tl.log(tl.sum(e, axis=0)) + peak), 0.0)
            if not FINISH:  # advancing (tolerance mode): the error of every iteration
                # |P1 - a|_1 + |P^T 1 - b|_1 at (f, g): rows exp(f + LSE_j), columns b exp(g - g')
                rows = tl.where(valid, tl.abs(tl.exp(f + (log_a - f)) - a), 0.0)
                cols = tl.where(valid, tl.abs(tl.exp(g + (log_b - g_next)) - b), 0.0)
                tl.store(err_ptr + pid * max_iter + start + step, tl.sum(rows, axis=0) + tl.sum(cols, axis=0))
        if FINISH:
            rows = tl.where(valid, tl.abs(tl.exp(f + (log_a - f)) - a), 0.0)
            cols = tl.where(valid, tl.abs(tl.exp(g + (log_b - g_next)) - b), 0.0)
            error = tl.sum(rows, axis=0) + tl.sum(cols, axis=0)
            plan = tl.where(mask2, tl.exp(log_kernel + f[:, None] + g[None, :]), 0.0)  # P = exp(M + f + g)
            tl.store(plan_ptr + base + offs[:, None] * k + offs[None, :], plan, mask=mask2)
            tl.store(out_ptr + pid * 2, error)
            tl.store(out_ptr + pid * 2 + 1, tl.sum(tl.sum(plan * cost, axis=1), axis=0))  # W = sum P C
        else:
            dst = state_ptr + ((start // chunk + 1) % 2) * slot_size + pid * BLOCK + offs
            tl.store(dst, f)
            tl.store(dst + pairs * BLOCK, g)
            tl.store(dst + 2 * pairs * BLOCK, g_next)


def _greedy_steps(
    sim_ptr, w_ptr, gap_ptr, order_ptr, n, k,
    BN: tl.constexpr, BI: tl.constexpr, SCOPE: tl.constexpr,
):
    """All k greedy steps of one group's coverage selection (program id = group).

    gap_ij = r_i max(0, sim_ij - mu_i) lives in gap_ptr (r_i = w_i for coverage, 1 for SCOPE);
    gain_j = sum_i gap_ij (times w_j for SCOPE); the first largest gain among the unchosen tokens is
    taken, then gap <- max(0, gap - gap[:, j]), as spatial._greedy_coverage does.
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BN)
    col_ok = cols < n
    base = pid.to(tl.int64) * n * n
    w_cols = tl.load(w_ptr + pid * n + cols, mask=col_ok, other=0.0)
    gain = tl.zeros([BN], dtype=tl.float32)
    for i0 in range(0, n, BI):
        rows = i0 + tl.arange(0, BI)
        ok = (rows < n)[:, None] & col_ok[None, :]
        where = base + rows[:, None] * n + cols[None, :]
        tile = tl.maximum(tl.load(sim_ptr + where, mask=ok, other=0.0), 0.0)  # max(0, sim - mu), mu = 0
        if not SCOPE:
            tile = tile * tl.load(w_ptr + pid * n + rows, mask=rows < n, other=0.0)[:, None]
        tl.store(gap_ptr + where, tile, mask=ok)
        gain += tl.sum(tile, axis=0)
    chosen = cols >= n  # padding is never a candidate
    for step in range(k):
        score = gain
        if SCOPE:
            score = gain * w_cols
        score = tl.where(chosen, float("-inf"), score)
        best = tl.max(score, axis=0)
        j = tl.minimum(tl.min(tl.where(score == best, cols, BN), axis=0), n - 1)  # first maximum
        tl.store(order_ptr + pid * k + step, j.to(tl.int64))
        chosen = chosen | (cols == j)
        if step + 1 < k:
            tl.debug_barrier()
            gain = tl.zeros([BN], dtype=tl.float32)
            for i0 in range(0, n, BI):
                rows = i0 + tl.arange(0, BI)
                ok = (rows < n)[:, None] & col_ok[None, :]
                where = base + rows[:, None] * n + cols[None, :]
                tile = tl.load(gap_ptr + where, mask=ok, other=0.0)
                # gap_ij: r_i (mu_i' - mu_i), taken from the tile in registers (no read-after-write race)
                column = tl.sum(tl.where(cols[None, :] == j, tile, 0.0), axis=1)
                tile = tl.maximum(tile - column[:, None], 0.0)
                tl.store(gap_ptr + where, tile, mask=ok)
                gain += tl.sum(tile, axis=0)


_BUILT: dict[tuple[str, bool], object] = {}
LAUNCHES = 0  # Triton launches made by this module since import (what the tests count)


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), counted in LAUNCHES. Every launch of this module goes through this
    module-level name, so a profiler may wrap it (benchmarks/gpu.py's `count_operations` does)."""
    global LAUNCHES
    LAUNCHES += 1
    kernel[grid](*args, **kwargs)


def cached_kernel(name: str, body: Callable[..., Any], sizes: tuple[str, ...] = ()) -> Any:
    """triton.jit(body), built once per mode (interpreter or compiled). `sizes`: its run-time integer
    arguments, compiled for any value: Triton otherwise compiles a variant per value class (1, a multiple
    of 16, other) of each, so a request whose sizes or iteration counts fall in a new class paid a compile
    (~0.6 s on an H200) that no warm-up could foresee."""
    key = (name, interpreting())
    if key not in _BUILT:
        _BUILT[key] = triton.jit(body, do_not_specialize=list(sizes))
    return _BUILT[key]


def built_kernel(name: str) -> Any | None:
    """The kernel `cached_kernel` built under `name` in the current mode (interpreter or compiled), or None
    before its first use; e.g. to read what it compiles for any value (`do_not_specialize`)."""
    return _BUILT.get((name, interpreting()))


def precompile(device: torch.device | str, pairs: int, tokens: int, max_iter: int, early_stop: bool) -> None:
    """Compile every variant of the Sinkhorn kernel that a request of `pairs` frame pairs can need with this
    iteration cap and stopping rule (each K block size: K is chosen by the content) and the greedy
    kernel's for `tokens` tokens a group, on `device` (warm-up: a first request then compiles nothing)."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    for k in (9, 17, 33, 65, 129):  # K blocks 16, 32, 64, 128, 256
        a = torch.full((pairs, k), 1.0 / k, device=device)
        cost = torch.rand(pairs, k, k, generator=generator).to(device)
        sinkhorn(a, a, cost, 0.1, max_iter, 1e-3, early_stop=early_stop)
    sim = torch.rand(1, tokens, tokens, generator=generator).to(device)
    w = torch.full((1, tokens), 1.0 / tokens, device=device)
    for scope in (False, True):
        greedy_coverage(sim, w, min(2, tokens), candidate_weighted=scope)


def _quiet():
    """The interpreter evaluates padded lanes too (-inf - -inf, log 0): silence numpy about them."""
    if interpreting():
        import numpy as np

        return np.errstate(invalid="ignore", divide="ignore", over="ignore")
    return contextlib.nullcontext()


def fits(k: int) -> bool:
    """Whether a K x K problem fits one program of the fused Sinkhorn."""
    return k <= MAX_BLOCK


def _warps(block: int) -> int:
    return 4 if block <= 64 else 8 if block <= 128 else 16


def sinkhorn(
    a: torch.Tensor, b: torch.Tensor, cost: torch.Tensor, eps: float, max_iter: int, tol: float,
    early_stop: bool = True, chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-domain Sinkhorn of every pair in Triton: a, b (P, K) > 0, cost (P, K, K).

    The same iteration and stopping rule as transport.sinkhorn: g then f, from f = 0; with
    early_stop, the batch stops after the first iteration at which its largest marginal error
    is below tol (decided on the device); without, exactly max_iter iterations.
    Returns (plan (P, K, K), iterations () int64 on the device, error (P,), W (P,)), float32.
    """
    pairs, k = a.shape
    device = a.device
    a, b = a.float().contiguous(), b.float().contiguous()
    cost = cost.float().contiguous()
    log_a, log_b = a.log(), b.log()
    block = max(16, triton.next_power_of_2(k))
    if block > MAX_BLOCK:
        raise ValueError(f"the fused Sinkhorn holds K <= {MAX_BLOCK}, got K = {k}")
    kernel = cached_kernel("sinkhorn", _sinkhorn_iterations,
                           ("pairs", "k", "done", "steps", "previous", "max_iter", "chunk"))
    plan = torch.empty(pairs, k, k, device=device, dtype=torch.float32)
    out = torch.empty(pairs, 2, device=device, dtype=torch.float32)
    state = torch.empty(2, 3, pairs, block, device=device, dtype=torch.float32)
    warps = _warps(block)
    chunk = max(1, min(chunk, max_iter)) if early_stop else max_iter
    common = dict(BLOCK=block, PBLOCK=min(256, max(16, triton.next_power_of_2(pairs))),
                  CBLOCK=max(16, triton.next_power_of_2(chunk)), EARLY=early_stop, num_warps=warps)
    with _quiet():
        return _run_sinkhorn(kernel, cost, log_a, log_b, a, b, plan, out, state, pairs, k, eps, max_iter, tol,
                             early_stop, chunk, common)


def _run_sinkhorn(kernel, cost, log_a, log_b, a, b, plan, out, state, pairs, k, eps, max_iter, tol,
                  early_stop, chunk, common):
    device = a.device
    if early_stop:
        err = torch.full((pairs, max_iter), float("inf"), device=device, dtype=torch.float32)
        halted = torch.zeros(pairs, device=device, dtype=torch.int32)
        done = 0
        previous = 0
        while done < max_iter:
            checkpoint("Sinkhorn")  # between launches: a cancelled request stops here (no GPU wait)
            steps = min(chunk, max_iter - done)
            launch(kernel, (pairs,), cost, log_a, log_b, a, b, state, err, halted, halted, plan, out,
                             pairs, k, -eps, tol, done, steps, previous, max_iter, chunk, FINISH=False, **common)
            done, previous = done + steps, steps
        # t* = the first iteration whose largest error over the batch is below tol, else max_iter
        below = err.amax(0) < tol
        stop = torch.where(below.any(), below.to(torch.uint8).argmax() + 1, max_iter).to(torch.int32)
    else:
        err = out  # unused
        halted = torch.zeros(1, device=device, dtype=torch.int32)
        stop = torch.full((1,), max_iter, device=device, dtype=torch.int32)
    launch(kernel, (pairs,), cost, log_a, log_b, a, b, state, err, halted, stop, plan, out,
                     pairs, k, -eps, tol, 0, 0, 0, max_iter, chunk, FINISH=True, **common)
    return plan, stop.reshape(()).long(), out[:, 0], out[:, 1]



def greedy_coverage(sim: torch.Tensor, w: torch.Tensor, k: int, candidate_weighted: bool = False) -> torch.Tensor:
    """Greedy coverage (Eq. 1; SCOPE with candidate_weighted) for every group in one launch.

    sim (T, N, N) cosine similarities, w (T, N) normalised saliency -> (T, k) int64 token indices
    in the order they were chosen (ties to the lowest index). Uses a (T, N, N) float32 workspace.
    """
    t, n, _ = sim.shape
    sim = sim.float().contiguous()
    w = w.float().contiguous()
    gap = torch.empty_like(sim)
    order = torch.empty(t, k, dtype=torch.long, device=sim.device)
    bn = max(16, triton.next_power_of_2(n))
    bi = max(1, min(triton.next_power_of_2(n), 8192 // bn))
    kernel = cached_kernel("greedy", _greedy_steps, ("n", "k"))
    with _quiet():
        launch(kernel, (t,), sim, w, gap, order, n, k, BN=bn, BI=bi, SCOPE=candidate_weighted, num_warps=4)
    return order


def _loop_bound(out_ptr, n):
    """A loop bounded by a run-time argument, as each kernel here has (backend.interpreter_problem)."""
    for i in range(0, n, 2):
        tl.store(out_ptr + i // 2, 1.0)


def probe() -> None:
    """One launch of a kernel whose loop bound is a run-time argument, on a CPU tensor (interpreter; not
    counted in LAUNCHES)."""
    cached_kernel("loop_bound", _loop_bound)[(1,)](torch.zeros(2), 3)
