"""Compression execution (paper Sec. 3.4): top-B matching per pair, merge or prune, union-find collapse."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .threads import serial


@dataclass
class Matching:
    """Per-pair decisions, shapes (P, K) over the source tokens of group t+1.

    target: row of group t each source would go to (its largest coupling entry);
    merged / pruned: the sources taken by the budget, split by C < tau_c (or C <= tau_c).
    """

    target: torch.Tensor
    merged: torch.Tensor
    pruned: torch.Tensor


def match_pairs(
    plan: torch.Tensor, cost: torch.Tensor, budgets: torch.Tensor, tau_c: float, inclusive: bool = False
) -> Matching:
    """Take the B_t sources of each pair with the largest coupling entries; merge if C < tau_c, else prune.

    plan, cost: (P, K, K) with rows = group t (destination), columns = group t+1 (source);
    budgets: (P,) integers <= K. Ties go to the lowest index (first maximum, stable sort).
    inclusive: merge if C <= tau_c (the authors' code) instead.
    """
    with serial(plan.device, plan.numel()):  # small ops, on one CPU thread (threads.py)
        best, target = plan.max(dim=1)  # each source column's largest entry and its destination row
        order = torch.sort(best, dim=-1, descending=True, stable=True).indices
        k = plan.shape[-1]
        in_budget = torch.arange(k, device=plan.device) < budgets.to(plan.device).unsqueeze(-1)
        taken = torch.zeros_like(in_budget).scatter_(1, order, in_budget)
        match_cost = cost.gather(1, target.unsqueeze(1)).squeeze(1)  # C_t[target(j), j]
        merged = taken & (match_cost <= tau_c if inclusive else match_cost < tau_c)
        return Matching(target=target, merged=merged, pruned=taken & ~merged)


@dataclass
class Collapse:
    """Result of collapsing the merge graph: node = (group t, selected slot k), flattened t*K + k.

    row: output row of each node's component, -1 if the component was dropped; (T*K,).
    roots: node ids of the kept roots, ascending; (M,). count: members per output row; (M,).
    """

    row: torch.Tensor
    roots: torch.Tensor
    count: torch.Tensor


def collapse(matching: Matching, groups: int, kept: int | None = None) -> Collapse:
    """Union-find over the merge edges of all pairs at once (pointer jumping, log2 T rounds).

    Each merged source (t+1, j) points to its destination (t, target_j); a chain's root is its
    earliest token. A pruned token is a root that is dropped with every token merged into it, so
    each executed operation removes exactly one output token: `kept`, if given, must be
    T*K - (merges + prunes), and lets the roots be listed without the host waiting for the device.
    """
    pairs, k = matching.merged.shape
    device = matching.merged.device
    nodes = groups * k
    node = torch.arange(nodes, device=device)
    parent = node.clone()
    dest = matching.target + torch.arange(pairs, device=device).unsqueeze(-1) * k  # node id in group t
    parent[k:] = torch.where(matching.merged.reshape(-1), dest.reshape(-1), node[k:])
    pruned = torch.zeros(nodes, dtype=torch.bool, device=device)
    pruned[k:] = matching.pruned.reshape(-1)
    root = parent
    for _ in range(max(groups - 1, 1).bit_length()):  # depth < T, so log2 T jumps reach every root
        root = root[root]
    kept_root = (root == node) & ~pruned
    row_of_root = torch.cumsum(kept_root.long(), 0) - 1
    row = torch.where(pruned[root], torch.full_like(root, -1), row_of_root[root])
    roots = node[kept_root] if kept is None else torch.nonzero_static(kept_root, size=kept).squeeze(-1)
    # members per output row; index_add rather than bincount(row[row >= 0]), which waits for the device
    count = torch.zeros(roots.numel(), dtype=torch.long, device=device)
    count.index_add_(0, row.clamp_min(0), (row >= 0).long())
    return Collapse(row=row, roots=roots, count=count)


def average_components(features: torch.Tensor, collapse_: Collapse) -> torch.Tensor:
    """Uniform average of each component's member features, in float32: (T*K, D) -> (M, D).

    Starts from the roots' own features and adds only the merged members, so a token that
    absorbed nothing comes out bit-identical.
    """
    m = collapse_.roots.numel()
    out = torch.empty(m + 1, features.shape[-1], device=features.device, dtype=torch.float32)
    with serial(features.device, out.numel()):  # a few row copies and sums, on one CPU thread (threads.py)
        if features.dtype == out.dtype:  # the roots' rows straight into place
            torch.index_select(features, 0, collapse_.roots, out=out[:m])
        else:
            out[:m] = features.index_select(0, collapse_.roots)
        out[m] = 0.0
        root_node = torch.zeros_like(collapse_.row, dtype=torch.bool)
        root_node.index_fill_(0, collapse_.roots, True)  # not `[roots] = True`: a scalar put waits for the device
        # Every node is added once, members to their row, the rest (roots, dropped) to the spare row m:
        # the same additions, in the same order, as adding the members alone, with no host round trip.
        target = torch.where((collapse_.row >= 0) & ~root_node, collapse_.row, m)
        out.index_add_(0, target, features.float())
        return out[:m].div_(collapse_.count.unsqueeze(-1).to(out.dtype))  # x / 1 == x: singletons stay exact
