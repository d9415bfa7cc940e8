"""topk: per-frame saliency top-k with the exact budget split over frames (docs/methods.md)."""

import pytest
import torch

from ottvid_cli.compression import methods
from test_methods import check_contract, tokens

SALIENCY = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]])


def run(ratio, saliency=SALIENCY, **options):
    x = torch.arange(saliency.numel() * 2, dtype=torch.float32).reshape(*saliency.shape, 2)
    return x, methods.compress_with("topk", x, saliency, (2, 2), ratio=ratio, **options)


def test_remainder_goes_to_the_frame_with_the_most_salient_next_token():
    # M = round(0.375 * 8) = 3: one token each, the third to frame 1 (its second best 0.6 > 0.5)
    x, out = run(0.375)
    assert out.index.tolist() == [0, 5, 7]
    assert out.report.details["per_frame"] == [1, 2]
    assert torch.equal(out.features, x.reshape(8, 2)[[0, 5, 7]])  # kept rows bit-identical
    assert out.assignment.tolist() == [0, -1, -1, -1, -1, 1, -1, 2]


def test_not_exact_keeps_round_ratio_n_per_frame():
    _, out = run(0.375, exact=False)  # round(1.5) = 2 per frame
    assert out.index.tolist() == [0, 2, 5, 7]


def test_ties_go_to_the_lowest_index_and_earliest_frame():
    _, out = run(0.375, saliency=torch.zeros(2, 4))
    assert out.index.tolist() == [0, 1, 4]  # frame 0 takes the extra token


def test_official_style_count_at_paper_shape():
    x, s, grid = tokens(16, 16, 16, 4, seed=0)
    assert methods.compress_with("topk", x, s, grid, ratio=0.1).features.shape[0] == 410
    out = methods.compress_with("topk", x, s, grid, ratio=0.1, exact=False)
    check_contract(out, x, 0.1, exact=False)
    assert out.features.shape[0] == 16 * 26


def test_saliency_none_means_lowest_indices():
    x = torch.randn(2, 4, 3)
    out = methods.compress_with("topk", x, None, (2, 2), ratio=0.5)
    assert out.index.tolist() == [0, 1, 4, 5]


@pytest.mark.parametrize("bad", [{"exact": 1}, {"bug_compatible": True}])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        methods.make_config("topk", **bad)
