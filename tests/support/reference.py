"""Literal, loop-by-loop float64 implementations of the paper's equations, to check the fast code against.

Slow on purpose: every sum and max is written the way the paper writes it.
"""

from __future__ import annotations

import math

import numpy as np


def cos(u: np.ndarray, v: np.ndarray) -> float:
    nu, nv = max(np.linalg.norm(u), 1e-8), max(np.linalg.norm(v), 1e-8)
    return float(np.dot(u, v) / (nu * nv))


def normalize(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if not np.all(np.isfinite(w)) or w.sum() <= 0:
        return np.full_like(w, 1.0 / len(w))
    return w / w.sum()


def select(x: np.ndarray, w: np.ndarray, k: int) -> list[int]:
    """Eq. 1 for one group: greedy saliency-weighted coverage; x (N, D), w (N,)."""
    n = len(x)
    w = normalize(w)
    sim = [[cos(x[i], x[j]) for j in range(n)] for i in range(n)]
    mu = [0.0] * n
    chosen: list[int] = []
    for _ in range(k):
        best, best_gain = None, -math.inf
        for j in range(n):
            if j in chosen:
                continue
            gain = sum(w[i] * max(0.0, sim[i][j] - mu[i]) for i in range(n))
            if gain > best_gain:  # strict: ties keep the lowest index
                best, best_gain = j, gain
        chosen.append(best)
        mu = [max(mu[i], sim[i][best]) for i in range(n)]
    return sorted(chosen)


def mass(x: np.ndarray, w: np.ndarray, selected: list[int], tau_m: float) -> np.ndarray:
    """Eq. 2-3 for one group."""
    w = normalize(w)
    k = len(selected)
    if k == 1:
        return np.ones(1)
    u = np.zeros(k)
    for i in range(len(x)):
        sims = [cos(x[i], x[s]) for s in selected]
        order = sorted(range(k), key=lambda c: (-sims[c], c))
        u[order[0]] += w[i] * max(0.0, sims[order[0]] - sims[order[1]])
    if u.max() <= 0:
        return np.full(k, 1.0 / k)
    e = np.exp(-(u / u.max()) / tau_m)
    return e / e.sum()


def alpha(x_t: np.ndarray, x_next: np.ndarray) -> float:
    """alpha_t = 1 - clamp(mean co-located cosine, 0, 1) / 2."""
    s_bar = np.mean([cos(x_t[n], x_next[n]) for n in range(len(x_t))])
    return 1.0 - min(max(s_bar, 0.0), 1.0) / 2.0


def cost(x_t, x_next, sel_t, sel_next, grid, a) -> np.ndarray:
    """Eq. 4-5: rows = selected tokens of group t, columns = of group t+1."""
    h, w = grid
    d_max = math.hypot(h - 1, w - 1)
    c = np.zeros((len(sel_t), len(sel_next)))
    for i, si in enumerate(sel_t):
        for j, sj in enumerate(sel_next):
            c_sem = 1.0 - cos(x_t[si], x_next[sj])
            loc = math.hypot(si // w - sj // w, si % w - sj % w) / d_max if d_max > 0 else 0.0
            c[i, j] = a * c_sem + (1 - a) * loc
    return c


def budget(W: list[float], total: int, cap: int, tau_b: float) -> tuple[list[int], int]:
    """Eq. 8 with App. C's overflow redistribution, then largest remainder (ties to lowest index)."""
    p = len(W)
    share = [0.0] * p
    active = [True] * p
    remaining = float(total)
    rounds = 0
    while remaining > 1e-9 * max(total, 1) and any(active):
        z = [math.exp(-W[t] / tau_b) if active[t] else 0.0 for t in range(p)]
        s = sum(z)
        for t in range(p):
            if active[t]:
                share[t] += min(z[t] / s * remaining, cap - share[t])
        remaining = total - sum(share)
        active = [share[t] < cap - 1e-9 for t in range(p)]
        rounds += 1
    base = [math.floor(v) for v in share]
    missing = total - sum(base)
    order = sorted(range(p), key=lambda t: (-(share[t] - base[t]) if base[t] < cap else 1.0, t))
    for t in order[:missing]:
        base[t] += 1
    return base, max(rounds - 1, 0)


def execute(plans, costs, budgets, tau_c, groups: int, k: int):
    """Top-B per pair, merge/prune, then union-find with chains collapsed to the earliest token.

    Returns (kept roots as (t, slot) sorted, {node: root} for every kept node).
    """
    parent = {}
    pruned = set()
    for t in range(groups - 1):
        plan, c = plans[t], costs[t]
        cand = []
        for j in range(k):
            col = [plan[i][j] for i in range(k)]
            best = max(col)
            i_star = col.index(best)
            cand.append((best, j, i_star))
        cand.sort(key=lambda e: (-e[0], e[1]))
        for _best, j, i_star in cand[: budgets[t]]:
            if c[i_star][j] < tau_c:
                parent[(t + 1, j)] = (t, i_star)
            else:
                pruned.add((t + 1, j))

    def find(node):
        while node in parent:
            node = parent[node]
        return node

    membership = {}
    for t in range(groups):
        for j in range(k):
            root = find((t, j))
            if root not in pruned:
                membership[(t, j)] = root
    roots = sorted(set(membership.values()))
    return roots, membership
