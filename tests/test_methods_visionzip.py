"""visionzip: dominant + contextual tokens per frame, bug_compatible, against the HoliTom video code."""

import pytest
import torch

from ottvid_cli.compression import methods
from test_methods import check_contract, official_or_skip, tokens

# one frame of 8 tokens (grid 2 x 4): tokens 1 and 6 are the most salient; 0 and 4 become targets;
# 2 and 3 point like 0, 5 and 7 like 4
X = torch.tensor([[1.0, 0.0], [5.0, 5.0], [1.0, 0.1], [2.0, 0.5], [0.0, 1.0], [0.1, 1.0], [-1.0, -1.0],
                  [0.2, 3.0]])[None]
S = torch.tensor([[0.1, 0.9, 0.2, 0.1, 0.3, 0.2, 0.8, 0.1]])
OPTIONS = {"exact": False, "tokens_per_frame": 4, "dominant_ratio": 0.5}  # d = 2, c = 2


def test_dominant_and_contextual_tokens_by_hand():
    # non-dominant list [0, 2, 3, 4, 5, 7], stride 6 // 2 = 3: targets at slots 0 and 3 = tokens 0, 4
    out = methods.compress_with("visionzip", X, S, (2, 4), **OPTIONS)
    assert out.index.tolist() == [0, 1, 4, 6]
    assert out.assignment.tolist() == [0, 1, 0, 0, 2, 2, 3, 2]
    x = X[0]
    expected = torch.stack([x[[0, 2, 3]].mean(0), x[1], x[[4, 5, 7]].mean(0), x[6]])
    torch.testing.assert_close(out.features, expected)
    assert torch.equal(out.features[[1, 3]], x[[1, 6]])  # dominant tokens bit-identical


def test_bug_compatible_contextual_is_target_plus_mean():
    out = methods.compress_with("visionzip", X, S, (2, 4), bug_compatible=True, **OPTIONS)
    x = X[0]
    torch.testing.assert_close(out.features[0], x[0] + x[[2, 3]].mean(0))
    torch.testing.assert_close(out.features[2], x[4] + x[[5, 7]].mean(0))


def test_targets_are_a_floored_stride():
    # 7 non-dominant tokens, 3 targets: stride 7 // 3 = 2, targets at slots 0, 2, 4 (the tail has none)
    x = torch.randn(1, 7, 3)
    out = methods.compress_with("visionzip", x, torch.zeros(1, 7), (1, 7), exact=False, tokens_per_frame=3,
                                dominant_ratio=0.0)
    assert out.index.tolist() == [0, 2, 4]


def test_grid_newline_scramble_only_when_bug_compatible():
    # d = int(3 * 0.7) = 2 dominant tokens: 3 (most salient) then 1; target 0 absorbs token 2
    x = torch.randn(1, 4, 3)
    s = torch.tensor([[0.0, 0.5, 0.1, 0.9]])
    common = {"exact": False, "tokens_per_frame": 3, "dominant_ratio": 0.7, "grid_newline": True}
    plain = methods.compress_with("visionzip", x, s, (2, 2), **common)
    assert plain.index.tolist() == [0, 1, 3]
    assert torch.equal(plain.features[1:], x[0, [1, 3]])
    buggy = methods.compress_with("visionzip", x, s, (2, 2), bug_compatible=True, **common)
    assert torch.equal(buggy.features[1:], x[0, [3, 1]])  # position 1 carries token 3's features
    torch.testing.assert_close(buggy.features[0], x[0, 0] + x[0, 2])


def test_exact_split_over_frames():
    x, s, grid = tokens(3, 4, 4, 6, seed=4)
    out = methods.compress_with("visionzip", x, s, grid, ratio=0.3)  # M = 14: 5, 5, 4
    check_contract(out, x, 0.3)
    assert sorted(out.report.details["per_frame"]) == [4, 5, 5]


@pytest.mark.parametrize("bad", [{"tokens_per_frame": 5}, {"dominant_ratio": 1.5}, {"bug_compatible": True},
                                 {"exact": False, "tokens_per_frame": 0}])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        methods.make_config("visionzip", **bad)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5])
def test_bug_compatible_grid_reproduces_the_official(ratio):
    official = official_or_skip("visionzip")
    for seed in range(3):
        x, s, grid = tokens(4, 8, 8, 12, seed=seed)
        expected = official(x, s, ratio, grid_newline=True)
        out = methods.compress_with("visionzip", x, s, grid, ratio=ratio, exact=False, bug_compatible=True,
                                    grid_newline=True)
        torch.testing.assert_close(out.features, expected)


def test_bug_compatible_one_token_reproduces_the_official_rows():
    """The one_token layout (LLaVA-OneVision) orders dominant before contextual tokens; same rows."""
    official = official_or_skip("visionzip")
    x, s, grid = tokens(4, 14, 14, 12, seed=7)
    expected = official(x, s, 0.1, tokens_per_frame=20)
    out = methods.compress_with("visionzip", x, s, grid, ratio=0.1, exact=False, bug_compatible=True,
                                tokens_per_frame=20)
    assert out.features.shape[0] == 4 * 20
    key = lambda rows: rows[torch.argsort(rows[:, 0])]  # noqa: E731
    torch.testing.assert_close(key(out.features), key(expected))
