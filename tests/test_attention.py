"""Packed vision attention (one call per block) against transformers' stock sdpa path, on tiny real
checkpoints; the CUDA backend choice (docs/attention.md)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.attention import (CUDNN_ENV, PACKED, choose_cuda_backends, packed_attention, packed_sdpa,
                                            register)
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"


class CountAttention(TorchFunctionMode):
    """Counts scaled_dot_product_attention calls (and any varlen kernel) made inside the block."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def reference(q, k, v, bounds, scale):
    """One sdpa call per segment, as transformers' sdpa path does."""
    out = torch.zeros_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            seg = [t[a:b].transpose(0, 1)[None] for t in (q, k, v)]
            out[a:b] = F.scaled_dot_product_attention(*seg, scale=scale)[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("bounds", [[0, 8, 16, 24, 32], [0, 8, 12, 20, 24, 24, 30], [0, 30]])
def test_packed_sdpa_equals_one_call_per_segment(bounds):
    torch.manual_seed(0)
    q, k, v = (torch.randn(bounds[-1], 3, 16) for _ in range(3))
    cu = torch.tensor(bounds, dtype=torch.int32)
    with CountAttention() as counter:
        out = packed_sdpa(q, k, v, cu, 0.25)
    torch.testing.assert_close(out, reference(q, k, v, bounds, 0.25), rtol=0, atol=1e-6)
    assert counter.calls == len({b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen kernels run on CUDA only")
@pytest.mark.parametrize("bounds", [[0, 64, 128, 144, 208, 224], [0, 1024, 2048], [0, 1024, 1536, 2560]])
def test_packed_sdpa_on_cuda_in_bf16(bounds):
    """Equal segments (one batched call), unequal ones of at most 128 tokens (a varlen kernel) and longer
    unequal ones (one call per length) against one call per segment, in bf16."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(bounds[-1], 16, 80, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    torch.testing.assert_close(packed_sdpa(q, k, v, cu, 80 ** -0.5), reference(q, k, v, bounds, 80 ** -0.5),
                               rtol=2e-2, atol=2e-2)


def test_packed_sdpa_leaves_tokens_outside_the_segments_at_zero():
    q, k, v = (torch.randn(12, 2, 8) for _ in range(3))
    out = packed_sdpa(q, k, v, torch.tensor([2, 6, 10]), None)
    torch.testing.assert_close(out[2:10], reference(q[2:10], k[2:10], v[2:10], [0, 4, 8], None))
    assert not out[:2].any() and not out[10:].any()


def test_packed_attention_without_segments_is_plain_sdpa():
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    mask = torch.ones(1, 1, 10, 10, dtype=torch.bool).tril()
    out, _ = packed_attention(torch.nn.Module(), q, k, v, attention_mask=mask, scaling=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="same segments"):
        packed_attention(torch.nn.Module(), q, k, v, cu_seq_lens_q=torch.tensor([0, 10]),
                         cu_seq_lens_k=torch.tensor([0, 5, 10]))


def test_registered_with_transformers():
    from transformers import AttentionInterface

    assert register() == PACKED and AttentionInterface()[PACKED] is packed_attention


@pytest.fixture(scope="module")
def qwen_pair(tiny_qwen):
    """The same tiny checkpoint loaded by default (packed vision) and with --attention sdpa (stock)."""
    return load_backbone(str(tiny_qwen)), load_backbone(str(tiny_qwen), attention="sdpa")


@pytest.fixture(scope="module")
def qwen_inputs(qwen_pair):
    clip = sample_frames(DATA / "bikes.mp4", 32)
    return qwen_pair[0].preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")


def vision_features(backbone, inputs):
    with torch.inference_mode(), CountAttention() as counter:
        out = backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    return out.pooler_output[0], counter.calls


def test_qwen2_5_vl_vision_in_at_most_two_calls_per_block(qwen_pair, qwen_inputs):
    ours, stock = qwen_pair
    assert ours.model.config.vision_config._attn_implementation == PACKED
    assert ours.model.config.text_config._attn_implementation == "sdpa" == ours.model.config._attn_implementation
    assert stock.model.config.vision_config._attn_implementation == "sdpa"
    t, h, w = qwen_inputs["video_grid_thw"][0].tolist()
    assert (t, h, w) == (16, 4, 12)  # 2 x 6 merged tokens a group: windows of 2 x 4 and 2 x 2 (two lengths)
    depth = ours.model.config.vision_config.depth
    features, calls = vision_features(ours, qwen_inputs)
    expected, stock_calls = vision_features(stock, qwen_inputs)
    assert calls <= 2 * depth
    assert stock_calls == 16 * 2 + 16  # the stock path: one call per window, then one per frame group
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)


def test_qwen2_5_vl_encode_and_saliency_unchanged(qwen_pair, qwen_inputs):
    ours, stock = qwen_pair
    a, b = ours.encode(qwen_inputs), stock.encode(qwen_inputs)
    torch.testing.assert_close(a.features, b.features, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.saliency, b.saliency, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fixture", ["tiny_qwen3_vl", "tiny_qwen3_vl_moe"])
def test_qwen3_vl_vision_in_one_call_per_block(fixture, request):
    folder = str(request.getfixturevalue(fixture))
    ours, stock = load_backbone(folder), load_backbone(folder, attention="sdpa")
    assert ours.model.config.vision_config._attn_implementation == PACKED
    clip = sample_frames(DATA / "bikes.mp4", 16)
    inputs = ours.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")
    features, calls = vision_features(ours, inputs)
    expected, stock_calls = vision_features(stock, inputs)
    depth = ours.model.config.vision_config.depth
    assert calls == depth and stock_calls == depth * int(inputs["video_grid_thw"][0, 0])
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)
    a, b = ours.encode(inputs), stock.encode(inputs)  # saliency and DeepStack features too
    torch.testing.assert_close(a.saliency, b.saliency, rtol=0, atol=1e-6)
    for x, y in zip(a.extra["deepstack"], b.extra["deepstack"]):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


def test_cuda_backends_leave_out_cudnn_unless_asked(monkeypatch):
    assert choose_cuda_backends(torch.device("cpu")) == {}
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        monkeypatch.delenv(CUDNN_ENV, raising=False)
        state = choose_cuda_backends(torch.device("cuda"))
        assert state == {"cudnn": False, "flash": True, "efficient": True, "math": True}
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setenv(CUDNN_ENV, "1")
        assert choose_cuda_backends(torch.device("cuda"))["cudnn"] is True
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
