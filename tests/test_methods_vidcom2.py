"""vidcom2: VidCom2 as vLLM runs it. Per-frame budgets, the exact count with a token in every frame,
vLLM's count and its final adjustment (which can empty a frame), and agreement with vLLM's decisions
(exact=False) on video-like tokens, checked against a reading of vLLM's code written here (vLLM itself
is not installed: a multi-gigabyte GPU package)."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import methods
from ottvid_cli.compression.methods.vidcom2 import vllm_count
from test_methods import check_contract, official_or_skip


def still_still_moving(q: float = 2 / 3):
    """Three frames of three tokens: two nearly the same (angles 0, 10, 20 and 2, 12, 22 degrees) and a
    distinct one (90, 180, 270), on two quiet channels; two loud channels (+-10) that the lowest-
    variance half of the channels leaves out."""
    angles = [(0, 10, 20), (2, 12, 22), (90, 180, 270)]
    quiet = torch.tensor([[[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in f] for f in angles])
    sign = torch.tensor([1.0, -1.0]).repeat(5)[:9].reshape(3, 3, 1)
    loud = 10 * torch.cat([sign, -sign], -1)
    return torch.cat([quiet, loud], -1), 1 - q


def test_a_distinct_frame_gets_the_larger_budget():
    x, ratio = still_still_moving()
    out = methods.compress_with("vidcom2", x, None, (1, 3), ratio=ratio)
    assert out.report.details["budget"] == [1, 1, 2]  # round(3 x 1/3 x (1 + p - 1/3)), p ~ (0, 0, 1)
    assert out.report.details["q"] == pytest.approx(2 / 3)


def test_vllms_adjustment_can_empty_a_frame_exact_keeps_one_in_each():
    # budgets 1 + 1 + 2 = 4 tokens for vLLM's count max(3, int(9 x 1/3)) = 3: vLLM drops the most
    # redundant kept token, the still frame 1's only one; exact keeps each frame's least redundant
    x, ratio = still_still_moving()
    loose = methods.compress_with("vidcom2", x, None, (1, 3), ratio=ratio, exact=False)
    assert loose.index.tolist() == [0, 6, 8] and loose.report.details["per_frame"] == [1, 0, 2]
    assert loose.index.tolist() == vllm_vidcom2_reference(x, 2 / 3)
    exact = methods.compress_with("vidcom2", x, None, (1, 3), ratio=ratio)
    assert exact.index.tolist() == [0, 3, 8] and exact.report.details["per_frame"] == [1, 1, 1]


def test_vllm_count():
    assert vllm_count(0.1, 16, 256) == 409 and methods.target_count(0.1, 16, 256) == 410
    assert vllm_count(0.01, 16, 4) == 16  # at least one token per frame
    assert vllm_count(0.1, 50, 2) == 50 and vllm_count(0.1, 100, 10) == 100  # int(99.99..) = 99 < T


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.integers(1, 8), h=st.integers(1, 4), w=st.integers(1, 4), d=st.integers(1, 8),
       ratio=st.floats(0.01, 1.0), seed=st.integers(0, 2**16))
def test_exact_count_and_a_token_in_every_frame(t, h, w, d, ratio, seed):
    x = video_like(t, h, w, d, seed)
    out = methods.compress_with("vidcom2", x, None, (h, w), ratio=ratio)
    check_contract(out, x, ratio)
    per_frame = torch.bincount(out.index // (h * w), minlength=t)
    m = methods.target_count(ratio, t, h * w)
    if m >= t:
        assert bool((per_frame >= 1).all())
    else:  # fewer tokens than frames: one in each of m frames
        assert bool((per_frame <= 1).all())
    assert torch.equal(out.features, x.reshape(-1, d)[out.index])


# ------------------------------------------------------------------------------------------------
# vLLM's decisions, read from vllm/multimodal/video_prune/vidcom2.py and written out here


def gaussians(y: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """Each token's closeness to `centre`: the squared distance d2 put through exp(-d2 / 2a) for the
    bandwidths a = 1/8, 1/4, 1/2, 1, 2 and added up (from the narrowest)."""
    d2 = ((y - centre) ** 2).sum(-1)
    out = torch.exp(-d2 / 0.25)
    for a in (0.25, 0.5, 1.0, 2.0):
        out = out + torch.exp(-d2 / (2 * a))
    return out


def vllm_vidcom2_reference(x: torch.Tensor, q: float) -> list[int]:
    """The flat positions vLLM's VidCom2 keeps of x (T, N, D) at pruning rate q, ascending.

    Reading of `compute_retained_tokens_count`: T*N times (1 - q) truncated, at least T, at most T*N.
    Reading of `compute_retention_mask`: over all tokens, the variance of each channel (biased); the
    floor(D / 2) channels (at least 1) of lowest variance, in increasing variance; the tokens on those
    channels, each scaled to unit length; a token's redundancy is its Gaussian closeness to the mean of
    all those unit tokens plus to its own frame's mean; a frame is distinctive by minus its tokens'
    mean closeness to the video's mean; softmax of distinctiveness (shifted by the largest) over 0.01;
    a frame's share is (1 - q) x (1 + its probability - the mean probability), capped at 1, and its
    budget that share of N, rounded, between 1 and N; each frame keeps its `budget` least redundant
    tokens. Then, over the whole video: while more are kept than the count, the most redundant kept
    tokens go; while fewer, the least redundant others come. vLLM picks among equal redundancies with
    an unsorted top-k, which leaves ties open; here a token at a lower flat position is preferred.
    """
    t, n, d = x.shape
    flat = x.reshape(t * n, d)
    spread = flat.var(dim=0, unbiased=False).tolist()
    channels = sorted(range(d), key=lambda c: spread[c])[: max(1, d // 2)]
    y = F.normalize(flat[:, channels].reshape(t, n, len(channels)), dim=-1)
    to_video = gaussians(y, y.mean(dim=(0, 1), keepdim=True))
    redundancy = (to_video + gaussians(y, y.mean(dim=1, keepdim=True))).tolist()
    distinct = -to_video.mean(dim=-1)
    p = torch.softmax((distinct - distinct.max()) / 0.01, dim=0)
    share = ((1.0 - q) * (1.0 + p - p.mean())).clamp(max=1.0)
    budget = (share * n).round().long().clamp(1, n).tolist()
    kept = set()
    for f in range(t):
        best = sorted(range(n), key=lambda j: (redundancy[f][j], j))[: budget[f]]
        kept.update(f * n + j for j in best)
    count = max(t, min(int(t * n * (1.0 - q)), t * n))
    value = lambda i: (redundancy[i // n][i % n], i)  # noqa: E731
    if len(kept) > count:
        kept = set(sorted(kept, key=value)[:count])
    elif len(kept) < count:
        others = sorted(set(range(t * n)) - kept, key=value)
        kept.update(others[: count - len(kept)])
    return sorted(kept)


def video_like(t: int, h: int, w: int, d: int, seed: int) -> torch.Tensor:
    """A textured scene that drifts with noise, a cut halfway, and a few loud channels."""
    g = torch.Generator().manual_seed(seed)
    n = h * w
    frames, scene = [], torch.randn(n, d, generator=g)
    loud = torch.randn(d, generator=g) * (torch.rand(d, generator=g) < 0.3) * 5
    for i in range(t):
        if i == t // 2 and t > 2:
            scene = torch.randn(n, d, generator=g)
        scene = scene + 0.3 * torch.randn(n, d, generator=g)
        frames.append(scene + loud * torch.randn(n, 1, generator=g))
    return torch.stack(frames)


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9, 0.95])
@pytest.mark.parametrize("seed", range(4))
def test_exact_false_is_vllms_decision(q, seed):
    t, h, w, d = [(8, 4, 6, 16), (12, 3, 5, 8), (5, 6, 6, 32), (3, 2, 2, 4)][seed]
    x = video_like(t, h, w, d, seed)
    out = methods.compress_with("vidcom2", x, None, (h, w), ratio=1 - q, exact=False)
    want = vllm_vidcom2_reference(x, q)
    assert out.index.tolist() == want
    assert torch.equal(out.features, x.reshape(t * h * w, d)[want])
    assert int((out.assignment >= 0).sum()) == len(want)  # nothing merged


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5])
def test_exact_false_matches_vllms_own_code(ratio):
    official = official_or_skip("vidcom2")
    for seed in range(2):
        x = video_like(8, 4, 4, 12, seed)
        index, features = official(x, None, ratio)
        out = methods.compress_with("vidcom2", x, None, (4, 4), ratio=ratio, exact=False)
        assert torch.equal(out.index, index) and torch.equal(out.features, features)
