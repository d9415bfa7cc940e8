"""evs: vLLM's Efficient Video Sampling. The first-group rule, the tie order, vLLM's count, and
agreement with vLLM's decisions (exact=False) on video-like tokens, checked against a reading of
vLLM's code written here (vLLM itself is not installed: a multi-gigabyte GPU package)."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.evs import pruning_rate, vllm_count
from test_methods import check_contract, official_or_skip, tokens


def at(*degrees):
    """Unit 2-D tokens at the given angles."""
    return [[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees]


# three groups of three tokens; angles chosen so that 1 - cos to the token before is known: group 1
# turns its tokens by 90, 0 and 60 degrees from group 0's (1 - cos: 1, 0, 0.5), group 2 by 0, 180
# and 30 from group 1's (0, 2, 0.13); group 0 has no group before it, and comes first
VIDEO = torch.tensor([at(0, 0, 0), at(90, 0, 60), at(90, 180, 90)])


def test_first_group_first_then_dissimilarity():
    out = methods.compress_with("evs", VIDEO, None, (1, 3), ratio=5 / 9)  # M = 5
    # group 0 whole (3), then the two largest 1 - cos: token 7 (2) and token 3 (1)
    assert out.index.tolist() == [0, 1, 2, 3, 7]
    assert torch.equal(out.features, VIDEO.reshape(9, 2)[[0, 1, 2, 3, 7]])
    assert out.report.details["per_frame"] == [3, 1, 1]


def test_vllm_keeps_the_first_group_whatever_q_says():
    # q = 0.9: vLLM's count is max(N, int(9 x 0.1)) = 3, the first group; exact keeps round(0.9) = 1
    loose = methods.compress_with("evs", VIDEO, None, (1, 3), ratio=0.1, exact=False)
    assert loose.index.tolist() == [0, 1, 2]
    exact = methods.compress_with("evs", VIDEO, None, (1, 3), ratio=0.1)
    assert exact.index.tolist() == [0]  # the head of the same ranking: the first group in raster order


def test_ties_go_to_the_earlier_position():
    # one vector everywhere: every 1 - cos is the same number, so the ranking is the flat order
    x = torch.tensor(at(40)).expand(4, 3, 2).contiguous()
    out = methods.compress_with("evs", x, None, (1, 3), ratio=0.5)  # M = 6
    assert out.index.tolist() == [0, 1, 2, 3, 4, 5]
    # ties between groups 1 and 2 at 1 - cos = 1: group 1's token first, then group 2's in raster order
    y = torch.tensor([at(0, 0, 0), at(90, 0, 0), at(90, 90, 90)])
    out = methods.compress_with("evs", y, None, (1, 3), ratio=5 / 9)
    assert out.index.tolist() == [0, 1, 2, 3, 7]  # 3, 7, 8 tie at 1: the earlier two


def test_vllm_count_in_its_float_arithmetic():
    # q = 0.9 and int(100 x (1 - 0.9)) = int(9.999999999999998) = 9 in vLLM; ours exact: 10
    assert pruning_rate(0.1) == 0.9
    assert vllm_count(0.1, 50, 2) == 9 and methods.target_count(0.1, 50, 2) == 10
    assert vllm_count(0.1, 16, 256) == 409 and vllm_count(0.01, 16, 256) == 256  # the first group
    x, s, grid = tokens(50, 1, 2, 4, seed=0)
    assert methods.compress_with("evs", x, s, grid, ratio=0.1, exact=False).index.numel() == 9
    assert methods.compress_with("evs", x, s, grid, ratio=0.1).index.numel() == 10


def test_saliency_and_signals_are_not_read():
    x, s, grid = tokens(4, 3, 3, 6, seed=4)
    base = methods.compress_with("evs", x, s, grid, ratio=0.3)
    other = methods.compress_with("evs", x, torch.rand_like(s), grid, ratio=0.3,
                                  signals={"attention": torch.rand_like(s)})
    assert torch.equal(base.index, other.index)


# ------------------------------------------------------------------------------------------------
# vLLM's decisions, read from vllm/multimodal/evs.py and written out here token by token


def vllm_evs_ranking(x: torch.Tensor, grid: tuple[int, int]) -> list[int]:
    """All flat positions of x (T, N, D) in the order vLLM's EVS prefers them.

    Reading of `compute_retention_mask`: the tokens are laid out (T, H', W', D); for every group but
    the first, each token's cosine similarity to the token in the same row and column of the group
    before (torch's cosine_similarity, in the features' dtype), subtracted from 1; the first group gets
    255, above any such value; all T*H'*W' values are sorted from the largest down, stably (equal
    values keep their flat order).
    """
    t, n, d = x.shape
    h, w = grid
    laid_out = x.reshape(t, h, w, d)
    change = (1 - F.cosine_similarity(laid_out[1:], laid_out[:-1], dim=-1)).reshape(-1).tolist()
    score = [255.0] * n + change
    return sorted(range(t * n), key=lambda i: -score[i])  # Python's sort is stable


def vllm_evs_reference(x: torch.Tensor, grid: tuple[int, int], q: float) -> list[int]:
    """The flat positions vLLM's EVS keeps at pruning rate q, ascending. Reading of
    `compute_retained_tokens_count`: the video's T*N tokens times (1 - q), truncated to an integer,
    but never below one group's N tokens; that many from the head of the ranking."""
    t, n, _ = x.shape
    count = max(n, int(t * n * (1 - q)))
    return sorted(vllm_evs_ranking(x, grid)[:count])


def video_like(t: int, h: int, w: int, d: int, seed: int) -> torch.Tensor:
    """Tokens with video's structure: a still background (the same vector everywhere, so that its
    changes tie exactly), a textured scene that drifts with noise, and a cut halfway."""
    g = torch.Generator().manual_seed(seed)
    n = h * w
    still = torch.randn(d, generator=g)
    frames, scene = [], torch.randn(n, d, generator=g)
    for i in range(t):
        if i == t // 2 and t > 2:
            scene = torch.randn(n, d, generator=g)  # the cut
        scene = scene + 0.3 * torch.randn(n, d, generator=g)
        frame = scene.clone()
        frame[: n // 3] = still
        frames.append(frame)
    return torch.stack(frames)


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9, 0.95])
@pytest.mark.parametrize("seed", range(4))
def test_exact_false_is_vllms_decision(q, seed):
    t, h, w, d = [(8, 4, 6, 16), (12, 3, 5, 8), (5, 6, 6, 32), (2, 2, 2, 4)][seed]
    x = video_like(t, h, w, d, seed)
    out = methods.compress_with("evs", x, None, (h, w), ratio=1 - q, exact=False)
    want = vllm_evs_reference(x, (h, w), q)
    assert out.index.tolist() == want
    assert torch.equal(out.features, x.reshape(t * h * w, d)[want])  # kept rows bit for bit
    assert out.assignment[out.index].tolist() == list(range(len(want)))
    assert int((out.assignment >= 0).sum()) == len(want)  # nothing merged


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.integers(1, 6), h=st.integers(1, 4), w=st.integers(1, 4), d=st.integers(1, 8),
       ratio=st.floats(0.01, 1.0), seed=st.integers(0, 2**16))
def test_exact_is_the_head_of_vllms_ranking(t, h, w, d, ratio, seed):
    x = video_like(t, h, w, d, seed)
    m = methods.target_count(ratio, t, h * w)
    out = methods.compress_with("evs", x, None, (h, w), ratio=ratio)
    check_contract(out, x, ratio)
    assert out.index.tolist() == sorted(vllm_evs_ranking(x, (h, w))[:m])
    assert torch.equal(out.features, x.reshape(-1, d)[out.index])


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5])
def test_exact_false_matches_vllms_own_code(ratio):
    official = official_or_skip("evs")
    for seed in range(2):
        x = video_like(8, 4, 4, 12, seed)
        index, features = official(x, None, ratio)
        out = methods.compress_with("evs", x, None, (4, 4), ratio=ratio, exact=False)
        assert torch.equal(out.index, index) and torch.equal(out.features, features)
