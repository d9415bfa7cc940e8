"""Temporal stage geometry and solver (paper Sec. 3.3): alpha_t, cost C_t, Sinkhorn plan P_t, W_t.

Pair t couples group t (rows, destination) with group t+1 (columns, source). Everything is
batched over the P = T-1 pairs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..interrupt import checkpoint
from .spatial import inverse_norms
from .threads import serial

# exp() of float32 arguments below this is < 1e-34 of the largest term of a log-sum-exp and
# cannot change the sum; clamping there avoids the very slow denormal path of CPU exp.
_EXP_FLOOR = -80.0


def mixing_weight(
    features: torch.Tensor,
    grid: tuple[int, int],
    mode: str | float = "position",
    inv_norm: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha_t = 1 - clamp(s_bar_t, 0, 1) / 2 for each pair of unpruned groups; (T, N, D) -> (T-1,).

    s_bar_t is the mean cosine similarity of co-located tokens of groups t and t+1 ("position"),
    of co-located 3x3 neighbourhood means (valid windows, no padding; "kernel"), or of the
    groups' mean features ("global"). A float fixes alpha_t for every pair. `inv_norm` (T, N)
    may be passed for "position" when the inverse token norms are already known.
    """
    t = features.shape[0]
    if not isinstance(mode, str):
        return torch.full((max(t - 1, 0),), float(mode), device=features.device)
    x = features.float()
    if mode == "global":
        x = x.mean(1, keepdim=True)
        inv_norm = None
    elif mode == "kernel":
        h, w = grid
        maps = x.transpose(1, 2).reshape(t, -1, h, w)
        x = F.avg_pool2d(maps, (min(3, h), min(3, w)), stride=1).flatten(2).transpose(1, 2)
        inv_norm = None
    elif mode != "position":
        raise ValueError(f"alpha must be position, kernel, global or a number, got {mode!r}")
    inv = inverse_norms(x) if inv_norm is None else inv_norm
    s_bar = (colocated_dots(x) * inv[:-1] * inv[1:]).mean(-1)
    return 1.0 - s_bar.clamp(0.0, 1.0) / 2.0


def colocated_dots(x: torch.Tensor, blocked: bool | None = None) -> torch.Tensor:
    """<x_{t,n}, x_{t+1,n}> for every pair and position: (T, N, D) -> (T-1, N).

    blocked (default: on the CPU): over blocks of about 1M elements with one reused buffer, so the
    element-wise products stay in cache instead of filling a (T-1, N, D) temporary. Otherwise one
    batched (1 x D) @ (D x 1) product per position: a single launch, no temporary (on GPUs).
    """
    pairs, tokens, dim = x.shape[0] - 1, x.shape[1], x.shape[2]
    if not (x.device.type == "cpu" if blocked is None else blocked) and pairs > 0:
        return torch.bmm(x[:-1].reshape(-1, 1, dim), x[1:].reshape(-1, dim, 1)).view(pairs, tokens)
    out = torch.empty(max(pairs, 0) * tokens, device=x.device, dtype=x.dtype)
    flat = x.reshape(-1, dim)
    rows = max(1, (1 << 20) // max(dim, 1))
    buffer = torch.empty(min(rows, max(out.numel(), 1)), dim, device=x.device, dtype=x.dtype)
    with serial(x.device, buffer.numel()):  # a loop of small ops, on one CPU thread (threads.py)
        for start in range(0, out.numel(), rows):
            stop = min(start + rows, out.numel())
            torch.mul(flat[start:stop], flat[start + tokens : stop + tokens], out=buffer[: stop - start])
            torch.sum(buffer[: stop - start], -1, out=out[start:stop])
    return out.view(max(pairs, 0), tokens)


def grid_positions(selected: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(row, col) grid index of each selected token: (T, k) -> (T, k, 2) float32."""
    w = grid[1]
    return torch.stack((torch.div(selected, w, rounding_mode="floor"), selected % w), -1).float()


def transport_cost(
    selected_features: torch.Tensor,
    positions: torch.Tensor,
    alpha: torch.Tensor,
    grid: tuple[int, int],
    inv_norm: torch.Tensor | None = None,
    semantic: str = "cosine",
    location: str = "diagonal",
) -> torch.Tensor:
    """C_t = alpha_t c_sem + (1 - alpha_t) c_loc (Eq. 4-5); returns (T-1, k, k), float32.

    selected_features: (T, k, D) features of the selected tokens; positions: (T, k, 2) grid
    (row, col); inv_norm: (T, k) their inverse norms, if already known.
    c_sem = 1 - cos(s_{t,i}, s_{t+1,j}) ("cosine"), or 1 - max(0, cos) ("clamped", the authors' code).
    c_loc ("diagonal") = ||p_{t,i} - p_{t+1,j}|| / d_max with d_max the grid diagonal
    sqrt((H-1)^2 + (W-1)^2) (c_loc = 0 when d_max = 0); "per_axis" (the authors' code) scales the
    positions to (row / (H-1), col / (W-1)) (an axis of length 1 stays 0) and divides the distance
    by sqrt(2). Both agree on square grids.
    """
    x = selected_features.float()
    inv = inverse_norms(x) if inv_norm is None else inv_norm
    cos = torch.bmm(x[:-1], x[1:].transpose(1, 2))  # on every thread; the rest on one CPU thread (threads.py)
    with serial(cos.device, cos.numel()):
        cos.mul_(inv[:-1].unsqueeze(-1)).mul_(inv[1:].unsqueeze(-2))
        c_sem = 1.0 - cos.clamp_(0.0 if semantic == "clamped" else -1.0, 1.0)
        if location == "per_axis":
            p = torch.stack((positions[..., 0] / max(grid[0] - 1, 1), positions[..., 1] / max(grid[1] - 1, 1)), -1)
            c_loc = torch.cdist(p[:-1], p[1:]) / math.sqrt(2.0)
        elif (d_max := math.hypot(grid[0] - 1, grid[1] - 1)) > 0:
            c_loc = torch.cdist(positions[:-1], positions[1:]) / d_max
        else:
            c_loc = torch.zeros_like(c_sem)
        a = alpha.view(-1, 1, 1)
        return a * c_sem + (1.0 - a) * c_loc


# What `sinkhorn` returns, by its `returns` argument (one loop, `_iterate`, under all three).
SINKHORN_RETURNS = ("plan", "error", "device")


def sinkhorn(
    a: torch.Tensor,
    b: torch.Tensor,
    cost: torch.Tensor,
    eps: float = 0.01,
    max_iter: int = 200,
    tol: float = 1e-5,
    *,
    returns: str = "plan",
    absorb: bool | None = None,
    check_every: int | None = None,
    early_stop: bool = True,
) -> tuple[torch.Tensor, int] | tuple[torch.Tensor, int | torch.Tensor, torch.Tensor]:
    """Entropic OT (Eq. 6): P_t = argmin_{P in Pi(m_t, m_{t+1})} sum_ij P_ij C_t,ij - eps H(P), in the log
    domain, float32, batched: a = m_t, b = m_{t+1} (P, K) > 0; cost C_t (P, K, K).

    `returns` chooses the result (the same iteration and the same numbers for each):
    - "plan": (plan P (P, K, K), iterations run, an int);
    - "error": (plan, iterations, an int, marginal error |P1 - a|_1 + |P^T1 - b|_1 per problem (P,));
    - "device": (plan, iterations as a () int64 tensor, error (P,)), all on the inputs' device: nothing
      is read back to the host for them (`solve_transport`'s PyTorch path).

    Each iteration updates the column potential g, then the row potential f (POT's
    `sinkhorn_log` order):  g = log b - LSE_i(-C_ij/eps + f_i),  f = log a - LSE_j(-C_ij/eps + g_j).
    The marginal error |P1 - a|_1 + |P^T1 - b|_1 is taken after every iteration and the loop stops
    once its largest value over the batch is below tol, or after max_iter iterations. The plan is
    P = exp(-C/eps + f_i + g_j). All in float32.

    On GPUs the host checks for convergence only every 10 iterations (`check_every`; 1 on the
    CPU, where a check costs nothing); a converged state is frozen on the device until then, so the
    result is that of checking every iteration.

    `early_stop=False` runs exactly max_iter iterations (the authors' code): no convergence check,
    no host synchronisation in the loop on GPUs; the error is measured once, at the end.

    Every `check_every` iterations the loop also calls `interrupt.checkpoint()`: a run cancelled from
    outside (a server request past its time) stops there with Interrupted.

    Two evaluations of the same LSEs (`absorb`, default: on for CPU tensors):
    - direct: each LSE exponentiates the whole (P, K, K) batch.
    - absorbed (log-stabilised, Schmitzer 2019): LSE_j(M_ij + g_j) = s_i + log sum_j R_ij exp(g_j - g0_j)
      with R_ij = exp(M_ij + g0_j - s_i) kept from the last "absorption" at g0. While every
      |g - g0| <= 10, this is the same sum to float32 precision, at the price of a batched
      product instead of a batched exp; past that, R is rebuilt at the current g.
    """
    if returns not in SINKHORN_RETURNS:
        raise ValueError(f"sinkhorn returns one of {', '.join(SINKHORN_RETURNS)}, got {returns!r}")
    if a.shape != b.shape or a.dim() != 2 or cost.shape != (*a.shape, a.shape[-1]):
        raise ValueError(
            f"sinkhorn expects a, b (P, K) and cost (P, K, K); got {tuple(a.shape)}, {tuple(b.shape)}, "
            f"{tuple(cost.shape)}"
        )
    if eps <= 0 or max_iter < 1 or tol <= 0:
        raise ValueError("sinkhorn needs eps > 0, max_iter >= 1 and tol > 0")
    with serial(a.device, cost.numel()):  # many small ops, on one CPU thread (threads.py)
        plan, iterations, error = _iterate(a, b, cost, eps, max_iter, tol, absorb, check_every, early_stop)
    if returns == "device":
        return plan, iterations, error
    if returns == "error":
        return plan, int(iterations), error
    return plan, int(iterations)


def solve_transport(
    a: torch.Tensor,
    b: torch.Tensor,
    cost: torch.Tensor,
    eps: float = 0.01,
    max_iter: int = 200,
    tol: float = 1e-5,
    early_stop: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sinkhorn plan P_t and transport difficulty W_t of every pair, on the chosen backend (backend.py).

    Returns (plan (P, K, K), iterations () int64 tensor, marginal error (P,), W (P,)), all on the
    inputs' device, without waiting for it on the Triton path. "triton" runs every iteration of
    every pair in kernels.sinkhorn (K <= 256; larger K falls back to PyTorch); "torch" is
    `sinkhorn(..., returns="device")` (which checks the tolerance from the host) followed by
    `transport_difficulty`.
    """
    from .backend import choose

    if choose(a.device, backend) == "triton":
        from . import kernels

        if kernels.fits(a.shape[-1]):
            return kernels.sinkhorn(a, b, cost, eps, max_iter, tol, early_stop=early_stop)
    with serial(a.device, cost.numel()):  # many small ops, on one CPU thread (threads.py)
        plan, iterations, error = sinkhorn(a, b, cost, eps, max_iter, tol, early_stop=early_stop, returns="device")
        return plan, iterations, error, transport_difficulty(plan, cost)


def _iterate(a, b, cost, eps, max_iter, tol, absorb, check_every, early_stop):
    """`sinkhorn`'s loop on checked inputs: (plan P_t, iterations, marginal error) as on the device."""
    if absorb is None:
        absorb = a.device.type == "cpu"
    a, b = a.float(), b.float()
    log_kernel = cost.float() / -eps  # M = -C/eps: rows i, columns j
    log_kernel_t = log_kernel.transpose(1, 2).contiguous()  # so both LSEs reduce over the last dim
    log_a, log_b = a.log(), b.log()
    rows = _Update(log_kernel, log_a, absorb)  # f = log a - LSE_j(M_ij + g_j)
    cols = _Update(log_kernel_t, log_b, absorb)  # g = log b - LSE_i(M_ij + f_i)
    marginals = torch.cat((a, b), -1)
    check_every = check_every or (1 if a.device.type == "cpu" else 10)
    f = torch.zeros_like(a)
    g_next = cols(f)  # the first iteration's column update
    g = g_next
    error: torch.Tensor | None = torch.full(a.shape[:1], float("inf"), device=a.device)
    done = torch.zeros((), dtype=torch.bool, device=a.device)
    iterations = torch.zeros((), dtype=torch.long, device=a.device)
    # The state after an iteration is (f, g): f was just computed from g, so rows sum to a (up to
    # rounding), and column j sums to b_j exp(g_j - g'_j), g' being the next column update, which
    # the next iteration needs anyway. On the host-checked path a cheap lower bound rules most
    # iterations out first: |c_j - b_j| = b_j |exp(d_j) - 1| >= min(b) (1 - exp(-|d_j|)), d = g - g';
    # if that reaches tol, so does the batch's largest error, and the loop goes on.
    # `moved` bounds how far both potentials moved in the last iteration: g by max|g - g'| (computed
    # for the bound), f by at most as much (an LSE is 1-Lipschitz in the max norm), which lets the
    # absorbed updates skip re-measuring their drift until it could have reached their limit.
    smallest_b = float(b.min()) if check_every == 1 else 0.0
    moved = None
    if not early_stop:
        error = None
    for step in range(1, max_iter + 1):
        if step % check_every == 0:  # a cancelled request stops here (a host flag: no GPU wait)
            checkpoint("Sinkhorn")
        g_step = g_next
        f_new = rows(g_step, moved)
        g_next = cols(f_new, moved)
        if not early_stop:
            f, g, iterations = f_new, g_step, step
            if absorb:  # the drift bound that spares the absorbed updates re-measuring it
                moved = float(torch.linalg.vector_norm(g_step - g_next, float("inf")))
            continue
        if check_every == 1:
            f, g, iterations = f_new, g_step, step
            worst = float(torch.linalg.vector_norm(g_step - g_next, float("inf")))
            moved = worst
            if smallest_b * -math.expm1(-worst) >= tol:
                error = None  # not converged; the exact error is only needed for the final state
                continue
            error = _marginal_error(f, g, g_next, log_a, log_b, marginals)
            if error.max().item() < tol:
                break
            continue
        error_new = _marginal_error(f_new, g_step, g_next, log_a, log_b, marginals)
        f, g = torch.where(done, f, f_new), torch.where(done, g, g_step)
        error = torch.where(done, error, error_new)
        g_next = torch.where(done, g_step, g_next)  # a frozen state repeats its own step
        iterations = iterations + (~done).long()
        done = done | (error.max() < tol)
        if step % check_every == 0 and bool(done):
            break
    if error is None:
        error = _marginal_error(f, g, g_next, log_a, log_b, marginals)
    plan = (log_kernel + f.unsqueeze(-1) + g.unsqueeze(-2)).exp()
    if isinstance(iterations, int):  # a fill, not a host-to-device copy
        iterations = torch.full((), iterations, dtype=torch.long, device=a.device)
    return plan, iterations, error


def _marginal_error(f, g, g_next, log_a, log_b, marginals) -> torch.Tensor:
    """|P1 - a|_1 + |P^T1 - b|_1 per problem at the state (f, g): row sums exp(f + LSE_j) with
    LSE_j = log a - f, column sums exp(g + LSE_i) with LSE_i = log b - g_next."""
    sums = torch.cat((f + (log_a - f), g + (log_b - g_next)), -1).exp_()
    return sums.sub_(marginals).abs_().sum(-1)


# Largest drift of a potential from its absorbed value before the kernel is rebuilt.
_ABSORB_AT = 10.0


class _Update:
    """x -> target - LSE over the last dim of (M + x[:, None, :]), batched; (P, K) -> (P, K).

    Direct: the LSE exponentiates the whole batch. Absorbed: exp(M + x0 - shift) is kept from the
    last anchor x0 (shift = its row maxima, folded into `target - shift`), so an update is
    target - shift - log sum_j kernel_ij exp(x_j - x0_j); the anchor moves once |x - x0| > 10.
    """

    def __init__(self, log_kernel: torch.Tensor, target: torch.Tensor, absorb: bool):
        self.log_kernel = log_kernel
        self.target = target
        self.absorb = absorb
        self.buffer = torch.empty_like(log_kernel)
        self.anchor: torch.Tensor | None = None  # x0, the absorbed potential
        self.kernel = torch.empty_like(log_kernel) if absorb else None  # exp(M + x0 - shift)
        self.base: torch.Tensor | None = None  # target - shift
        self.drift_bound = 0.0  # an upper bound of max|x - x0|

    def __call__(self, x: torch.Tensor, moved: float | None = None) -> torch.Tensor:
        """`moved`: a bound on max|x - previous x|, if known; the drift is then re-measured only when
        the accumulated bound could exceed the limit."""
        if not self.absorb:
            return self.target - _lse_last(self.log_kernel, x, self.buffer)
        drift = None if self.anchor is None else x - self.anchor
        if drift is not None:
            self.drift_bound = self.drift_bound + moved if moved is not None else float("inf")
            if self.drift_bound > _ABSORB_AT:
                self.drift_bound = float(torch.linalg.vector_norm(drift, float("inf")))
        if drift is None or self.drift_bound > _ABSORB_AT:
            self.anchor, drift, self.drift_bound = x, torch.zeros_like(x), 0.0
            torch.add(self.log_kernel, x.unsqueeze(1), out=self.kernel)
            shift = self.kernel.amax(-1, keepdim=True)
            self.kernel.sub_(shift).clamp_(min=_EXP_FLOOR).exp_()
            self.base = self.target - shift.squeeze(-1)
        torch.mul(self.kernel, drift.exp_().unsqueeze(1), out=self.buffer)
        return torch.sub(self.base, self.buffer.sum(-1).log_())


def _lse_last(log_kernel: torch.Tensor, potential: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """LSE over the last dim of log_kernel + potential[:, None, :], using `buffer` as scratch."""
    torch.add(log_kernel, potential.unsqueeze(1), out=buffer)
    peak = buffer.amax(-1, keepdim=True)
    buffer.sub_(peak).clamp_(min=_EXP_FLOOR).exp_()
    return buffer.sum(-1).log_().add_(peak.squeeze(-1))


def marginal_error(plan: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|P1 - a|_1 + |P^T1 - b|_1 per problem: (P, K, K) -> (P,)."""
    return (plan.sum(-1) - a).abs().sum(-1) + (plan.sum(-2) - b).abs().sum(-1)


def transport_difficulty(plan: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """W_t = sum_ij P_ij C_ij (Eq. 7): (P, K, K) -> (P,)."""
    return (plan * cost).sum((-2, -1))
