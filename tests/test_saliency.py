"""Attention saliency: recomputed in query chunks, and computed with the attention itself."""

import pytest
import torch
import torch.nn.functional as F

from ottvid_cli.backbones.attention import (SALIENCY, attend, packed_sdpa, packed_sdpa_saliency, recording,
                                            recording_attention)
from ottvid_cli.backbones.saliency import (attention_and_received, attention_lse, mean_attention_received,
                                           received_from_lse, shared_softmax_attention)


def naive(q, k, bounds, scale):
    out = torch.zeros(q.shape[0])
    for a, b in zip(bounds[:-1], bounds[1:]):
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) * scale
        out[a:b] = scores.softmax(-1).mean((0, 1))
    return out


def test_matches_full_softmax_for_equal_and_unequal_segments():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(60, 3, 8, generator=g), torch.randn(60, 3, 8, generator=g)
    for bounds in ([0, 20, 40, 60], [0, 7, 33, 60]):
        got = mean_attention_received(q, k, bounds, 0.35, chunk=6)
        torch.testing.assert_close(got, naive(q, k, bounds, 0.35))
        for a, b in zip(bounds[:-1], bounds[1:]):
            torch.testing.assert_close(got[a:b].sum(), torch.tensor(1.0))


def test_low_precision_inputs_score_in_float32():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(32, 2, 4, generator=g), torch.randn(32, 2, 4, generator=g)
    got = mean_attention_received(q.bfloat16(), k.bfloat16(), [0, 16, 32], 0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, naive(q.bfloat16().float(), k.bfloat16().float(), [0, 16, 32], 0.5))


def test_segments_beyond_the_score_budget_go_in_steps():
    """16 heads x 512 x 512 scores fill the CPU's budget: one segment a step, each still exact."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1536, 16, 8, generator=g), torch.randn(1536, 16, 8, generator=g)
    bounds = [0, 512, 1024, 1536]
    torch.testing.assert_close(mean_attention_received(q, k, bounds, 0.3), naive(q, k, bounds, 0.3))


# -- the saliency computed with the attention itself (one pass over the scores) ------------------------------

def batched(n_segments=3, heads=4, n=40, dim=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n_segments, heads, n, dim, generator=g) for _ in range(3)]


def naive_batched(q, k, scale):
    """(B, H, n, d) -> (B, n): the full softmax, mean over heads and queries."""
    return (torch.einsum("bhqd,bhkd->bhqk", q, k) * scale).softmax(-1).mean((1, 2))


def test_attention_and_received_is_sdpa_and_the_old_saliency():
    """fp32 on the CPU: the output is scaled_dot_product_attention's bit for bit (the kernel's own), the
    saliency the old recomputation's (`mean_attention_received` on the same q, k) within 1e-6 relative."""
    q, k, v = batched()
    out, received = attention_and_received(q, k, v, 0.3, chunk=7)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), rtol=0, atol=0)
    b, h, n, d = q.shape
    old = mean_attention_received(q.transpose(1, 2).reshape(b * n, h, d), k.transpose(1, 2).reshape(b * n, h, d),
                                  [i * n for i in range(b + 1)], 0.3).reshape(b, n)
    torch.testing.assert_close(received, old, rtol=1e-6, atol=0)
    torch.testing.assert_close(received, naive_batched(q, k, 0.3), rtol=1e-6, atol=0)


def test_lse_and_shared_softmax_paths_agree():
    """The two ways: from the kernel's log-sum-exp (one Q K^T pass, no normalisation), and one softmax
    shared by P @ V and P's column sums; both against the full softmax."""
    q, k, v = batched(n=33, seed=5)
    out, lse = attention_lse(q, k, v, 0.25)
    torch.testing.assert_close(lse, (torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.25).logsumexp(-1), rtol=1e-6, atol=1e-6)
    from_lse = received_from_lse(q, k, lse, 0.25, chunk=5)
    shared_out, shared = shared_softmax_attention(q, k, v, 0.25, chunk=5)
    want = naive_batched(q, k, 0.25)
    torch.testing.assert_close(from_lse, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(shared, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(shared_out, out, rtol=0, atol=1e-6)
    assert torch.allclose(from_lse.sum(-1), torch.ones(q.shape[0]))


def test_received_from_lse_takes_the_given_normaliser():
    """Not a softmax of its own: a log-sum-exp larger by log 2 halves every weight."""
    q, k, v = batched(n_segments=1, n=12)
    _, lse = attention_lse(q, k, v, 0.5)
    torch.testing.assert_close(received_from_lse(q, k, lse + torch.log(torch.tensor(2.0)), 0.5),
                               received_from_lse(q, k, lse, 0.5) / 2)


def test_low_precision_attention_scores_the_saliency_in_float32():
    q, k, v = (t.bfloat16() for t in batched(n=24, seed=7))
    out, received = attention_and_received(q, k, v, 0.25)
    assert out.dtype == torch.bfloat16 and received.dtype == torch.float32
    torch.testing.assert_close(received, naive_batched(q.float(), k.float(), 0.25), rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("bounds", [[0, 20, 40, 60], [0, 7, 33, 33, 60], [5, 25, 45], [0, 60]])
def test_packed_sdpa_saliency_is_packed_sdpa_and_the_old_saliency(bounds):
    """Equal segments (one batch), unequal ones (one batch per length), segments that do not start at 0
    (tokens outside them: output and saliency 0)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(60 if bounds[-1] == 60 else 50, 3, 8, generator=g) for _ in range(3))
    cu = torch.tensor(bounds, dtype=torch.int32)
    out, received = packed_sdpa_saliency(q, k, v, cu, 0.35)
    torch.testing.assert_close(out, packed_sdpa(q, k, v, cu, 0.35), rtol=0, atol=1e-6)
    old = mean_attention_received(q, k, bounds, 0.35, chunk=6)
    torch.testing.assert_close(received, old, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(received, naive(q, k, bounds, 0.35), rtol=1e-6, atol=1e-9)


def test_attend_records_only_while_recording():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(24, 2, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 12, 24])
    module = torch.nn.Module()
    plain = attend(module, q, k, v, cu, 0.4)
    with recording(module) as record:
        out = attend(module, q, k, v, cu, 0.4)
    assert not hasattr(module, SALIENCY)
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(record["received"], naive(q, k, [0, 12, 24], 0.4), rtol=1e-6, atol=1e-9)
    assert record["cu_seqlens"] is cu


def test_recording_attention_is_transformers_sdpa_and_records_per_frame():
    """The SigLIP towers' attention function: transformers' sdpa outside `recording`; inside, the same
    output ((B, n, H, d)) and each frame's received attention (B, n)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = batched(n_segments=2, heads=2, n=20, dim=8, seed=9)
    module = torch.nn.Module()
    module.is_causal = False
    want, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.3)
    plain, _ = recording_attention(module, q, k, v, None, scaling=0.3)
    with recording(module) as record:
        out, weights = recording_attention(module, q, k, v, None, scaling=0.3)
    assert weights is None
    torch.testing.assert_close(plain, want, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(record["received"], naive_batched(q, k, 0.3), rtol=1e-6, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA attention kernels need a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dim", [80, 72])  # Qwen's vision heads; 72: a size flash takes, as SigLIP's
def test_on_cuda_the_kernels_log_sum_exp_gives_the_saliency(dtype, dim):
    """On CUDA the output is SDPA's (flash for half precision, memory-efficient for float32, whose
    log-sum-exp rows are padded) and the saliency the full softmax's, scored in float32."""
    q, k, v = (t.to("cuda", dtype) for t in batched(n_segments=2, heads=4, n=300, dim=dim, seed=5))
    found = attention_lse(q, k, v, dim ** -0.5)
    assert found is not None  # a kernel that returns its log-sum-exp took these inputs
    out, received = attention_and_received(q, k, v, dim ** -0.5)
    assert out.dtype == dtype and received.dtype == torch.float32 and received.device.type == "cuda"
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.float(), F.scaled_dot_product_attention(q, k, v, scale=dim ** -0.5).float(),
                               rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(received.cpu(), naive_batched(q.float().cpu(), k.float().cpu(), dim ** -0.5),
                               rtol=max(tolerance, 1e-4), atol=1e-6)
