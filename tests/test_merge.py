"""Compression execution: top-B matching, merge vs prune, union-find collapse."""

import pytest
import torch

from ottvid_cli.compression import collapse, match_pairs
from ottvid_cli.compression.merge import average_components
from tests.support.reference import execute as ref_execute


def test_chain_merge_and_prune_by_hand():
    plans = torch.tensor([
        [[0.4, 0.1], [0.0, 0.5]],  # pair 0: source 1 -> dest 1 has the largest entry (0.5)
        [[0.45, 0.05], [0.05, 0.45]],  # pair 1: both sources taken
    ])
    costs = torch.tensor([
        [[0.0, 0.9], [0.9, 0.1]],
        [[0.5, 0.9], [0.9, 0.2]],  # source 0's match costs 0.5 >= tau_c: pruned
    ])
    m = match_pairs(plans, costs, torch.tensor([1, 2]), tau_c=0.3)
    assert m.target.tolist() == [[0, 1], [0, 1]]
    assert m.merged.tolist() == [[False, True], [False, True]]
    assert m.pruned.tolist() == [[False, False], [True, False]]
    c = collapse(m, groups=3)
    # nodes t*2 + k: {0}, {1, 3, 5} rooted at 1, {2}, {4} pruned
    assert c.roots.tolist() == [0, 1, 2]
    assert c.row.tolist() == [0, 1, 2, 1, -1, 1]
    assert c.count.tolist() == [1, 3, 1]
    feats = torch.arange(6.0).unsqueeze(-1).repeat(1, 3)
    out = average_components(feats, c)
    torch.testing.assert_close(out, torch.tensor([[0.0] * 3, [3.0] * 3, [2.0] * 3]))


def test_component_with_pruned_root_is_dropped_whole():
    plans = torch.tensor([[[0.5, 0.0], [0.0, 0.5]], [[0.5, 0.0], [0.0, 0.5]]])
    costs = torch.tensor([[[0.9, 0.9], [0.9, 0.9]], [[0.1, 0.9], [0.9, 0.9]]])
    # pair 0 prunes (1, 0); pair 1 merges (2, 0) into it: both go, and each operation removed one token
    m = match_pairs(plans, costs, torch.tensor([1, 1]), tau_c=0.3)
    c = collapse(m, groups=3)
    assert c.row.tolist() == [0, 1, -1, 2, -1, 3]
    assert c.roots.numel() == 6 - 2


def test_ties_take_the_lowest_source_and_destination():
    plan = torch.full((1, 3, 3), 0.1)
    m = match_pairs(plan, torch.zeros(1, 3, 3), torch.tensor([2]), tau_c=0.3)
    assert m.target.tolist() == [[0, 0, 0]]
    assert m.merged.tolist() == [[True, True, False]]


def test_unmerged_rows_are_bit_identical():
    feats = torch.randn(4, 7).half()
    m = match_pairs(torch.eye(2).unsqueeze(0) / 2, torch.zeros(1, 2, 2), torch.tensor([0]), 0.3)
    c = collapse(m, groups=2)
    assert torch.equal(average_components(feats, c).half(), feats)


@pytest.mark.parametrize("seed", range(8))
def test_matches_reference_union_find(seed):
    g = torch.Generator().manual_seed(seed)
    groups, k = 6, 5
    plans = torch.rand(groups - 1, k, k, generator=g)
    costs = torch.rand(groups - 1, k, k, generator=g) * 0.6
    budgets = torch.randint(0, k + 1, (groups - 1,), generator=g)
    c = collapse(match_pairs(plans, costs, budgets, 0.3), groups)
    roots, membership = ref_execute(plans.tolist(), costs.tolist(), budgets.tolist(), 0.3, groups, k)
    assert c.roots.tolist() == [t * k + j for t, j in roots]
    assert c.roots.numel() == groups * k - int(budgets.sum())  # one token per executed operation
    row_of = {root: r for r, root in enumerate(roots)}
    want = [row_of[membership[(t, j)]] if (t, j) in membership else -1 for t in range(groups) for j in range(k)]
    assert c.row.tolist() == want
