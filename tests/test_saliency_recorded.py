"""The saliency computed by the last vision block as it attends (`attention.recording`), on every backbone's
tiny model at float32 on the CPU: equal to the recomputation from that block's q and k that the stock
attention path keeps (`saliency.mean_attention_received`, the algorithm before), and the tower's outputs
unchanged."""

import contextlib
from pathlib import Path

import pytest
import torch

from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.attention import recording, records_saliency
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"
BACKBONES = ["tiny_qwen", "tiny_qwen3_vl", "tiny_qwen3_vl_moe", "tiny_llava_ov"]


def last_attention(backbone):
    if hasattr(backbone, "last_vision_attention"):
        return backbone.last_vision_attention()
    return backbone.model.model.visual.blocks[-1].attn


@pytest.fixture(scope="module", params=BACKBONES)
def pair(request):
    """(ours: the default attention, which records; stock: transformers' sdpa, which recomputes; inputs)."""
    folder = str(request.getfixturevalue(request.param))
    ours, stock = load_backbone(folder), load_backbone(folder, attention="sdpa")
    clip = sample_frames(DATA / "bikes.mp4", 8)
    inputs = ours.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")
    return ours, stock, inputs


def test_the_default_attention_records_and_sdpa_recomputes(pair):
    ours, stock, _ = pair
    assert records_saliency(last_attention(ours)) and not records_saliency(last_attention(stock))


def test_recorded_saliency_equals_the_recomputed_one(pair):
    ours, stock, inputs = pair
    a, b = ours.encode(inputs), stock.encode(inputs)
    assert a.saliency.dtype == b.saliency.dtype == torch.float32
    torch.testing.assert_close(a.saliency, b.saliency, rtol=1e-6, atol=1e-6 * float(b.saliency.abs().max()))
    torch.testing.assert_close(a.features, b.features, rtol=0, atol=1e-6)


def test_recording_leaves_the_tower_outputs_as_they_were(pair):
    ours, _, inputs = pair
    with_saliency, without = ours.encode(inputs), ours.encode(inputs, saliency=False)
    assert without.saliency is None
    torch.testing.assert_close(with_saliency.features, without.features, rtol=0, atol=1e-6)
    for x, y in zip(with_saliency.extra.get("deepstack", ()), without.extra.get("deepstack", ())):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_the_saliency_comes_from_the_forward_not_a_second_pass(pair):
    """The record holds the received attention after the tower ran; nothing of the block's q, k or qkv is
    kept for a recomputation."""
    ours, _, inputs = pair
    with contextlib.ExitStack() as stack:
        if hasattr(ours, "capture_saliency"):
            record = ours.capture_saliency(stack)
            ours.model.model.get_video_features(pixel_values_videos=inputs["pixel_values_videos"],
                                                video_grid_thw=inputs["video_grid_thw"])
        else:
            record = stack.enter_context(recording(last_attention(ours)))
            ours.model.model.get_video_features(pixel_values_videos=inputs["pixel_values_videos"])
    assert set(record) <= {"received", "cu_seqlens"} and "received" in record
    received = record["received"]
    if received.dim() == 2:  # SigLIP: (frames, patches), each frame's attention sums to 1
        torch.testing.assert_close(received.sum(-1), torch.ones(received.shape[0]))
    else:  # Qwen: (patches,) in the tower's order, each segment's attention sums to 1
        bounds = record["cu_seqlens"].tolist()
        sums = torch.stack([received[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])])
        torch.testing.assert_close(sums, torch.ones(len(bounds) - 1))


def naive_last_block(backbone, inputs):
    """The old algorithm written out: hooks keep the last block's qkv output, rotary cos / sin and
    segments; rotary, full softmax per segment, mean over heads and queries, sum over each merge unit,
    window order undone (Qwen2.5-VL and Qwen3-VL)."""
    attn = backbone.model.model.visual.blocks[-1].attn
    seen = {}
    hooks = [attn.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True),
             attn.qkv.register_forward_hook(lambda m, a, out: seen.update(qkv=out))]
    try:
        backbone.model.model.get_video_features(pixel_values_videos=inputs["pixel_values_videos"],
                                                video_grid_thw=inputs["video_grid_thw"])
    finally:
        for hook in hooks:
            hook.remove()
    seq = seen["qkv"].shape[0]
    qkv = seen["qkv"].reshape(seq, 3, attn.num_heads, -1).permute(1, 0, 2, 3)
    q, k = backbone.apply_rotary(qkv[0], qkv[1], *seen["position_embeddings"])
    bounds = seen["cu_seqlens"].tolist()
    received = torch.zeros(seq)
    for a, b in zip(bounds[:-1], bounds[1:]):
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) * attn.scaling
        received[a:b] = scores.softmax(-1).mean((0, 1))
    unit = backbone.merge ** 2
    return backbone.window_to_raster(received.reshape(-1, unit).sum(-1), inputs["video_grid_thw"])


@pytest.mark.parametrize("fixture", ["tiny_qwen", "tiny_qwen3_vl"])
def test_qwen_recorded_saliency_equals_the_full_softmax(fixture, request):
    """Qwen2.5-VL (windowed tower, full-attention last block) and Qwen3-VL against a full softmax."""
    backbone = load_backbone(str(request.getfixturevalue(fixture)))
    clip = sample_frames(DATA / "cockatoo.mp4", 6)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")
    with torch.inference_mode():
        want = naive_last_block(backbone, inputs)
    got = backbone.encode(inputs).saliency
    torch.testing.assert_close(got.reshape(-1), want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


def test_vllm_plugin_records_in_the_last_blocks_attention_backend():
    """`LastBlockSaliency` on a stand-in of vLLM's tower (blocks[-1].attn.attn called with the rotated q, k
    and cu_seqlens, as `Qwen2_5_VisionAttention.forward` calls its `MMEncoderAttention`): the backend is
    swapped for `RecordingAttention` while the video is encoded and put back after; the output is the
    backend's, the saliency the full softmax's, summed per merge unit; other blocks are left alone."""
    from types import SimpleNamespace

    import torch.nn.functional as F
    from torch import nn

    from ottvid_cli.backbones.attention import packed_sdpa
    from ottvid_cli.integrations.vllm.saliency import LastBlockSaliency, RecordingAttention

    class Backend(nn.Module):  # vLLM's MMEncoderAttention: (1, s, H, d) within cu_seqlens segments
        scale = 0.3

        def forward(self, query, key, value, cu_seqlens=None, max_seqlen=None, sequence_lengths=None):
            return packed_sdpa(query[0], key[0], value[0], cu_seqlens, self.scale)[None]

    class VisionAttention(nn.Module):
        num_attention_heads_per_partition, tp_size = 2, 1

        def __init__(self):
            super().__init__()
            self.attn = Backend()

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 32, 2, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    seen = []

    class Tower(nn.Module):
        spatial_merge_unit = 4

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Module(), nn.Module()])
            for block in self.blocks:
                block.attn = VisionAttention()

    class Stock:
        def _process_video_input(self, video_input):
            for block in self.visual.blocks:
                seen.append((type(block.attn.attn), block.attn.attn(query=q, key=k, value=v, cu_seqlens=cu,
                                                                    max_seqlen=None, sequence_lengths=None)))
            return ("embeds",)

    class Model(LastBlockSaliency, Stock):
        def __init__(self):
            self.visual, self.ottvid = Tower(), SimpleNamespace(method="ottvid")

    model = Model()
    assert model._process_video_input({"type": "pixel_values_videos", "video_grid_thw": torch.tensor([[2, 4, 4]])}) \
        == ("embeds",)
    assert [kind for kind, _ in seen] == [Backend, RecordingAttention]
    assert all(type(block.attn.attn) is Backend for block in model.visual.blocks)  # put back
    torch.testing.assert_close(seen[1][1], seen[0][1], rtol=0, atol=1e-6)
    want = torch.zeros(32)
    for a, b in ((0, 16), (16, 32)):
        scores = torch.einsum("qhd,khd->hqk", q[0, a:b], k[0, a:b]) * 0.3
        want[a:b] = F.softmax(scores, -1).mean((0, 1))
    (saliency,) = model._saliency
    torch.testing.assert_close(saliency, want.reshape(8, 4).sum(-1), rtol=1e-6, atol=1e-7)


def test_the_saliency_benchmark_compares_the_same_numbers():
    """`python -m benchmarks.saliency`: both ways give one output and one saliency (at one group, one repeat)."""
    from benchmarks.saliency import measure

    result = measure(groups=1, repeats=1)
    assert set(result["rows"]) == {"second pass", "recorded"} and all(ms > 0 for ms in result["rows"].values())
    assert result["output_gap"] <= 1e-6 and result["saliency_gap"] <= 1e-5
    assert result["environment"]["device"] == "cpu"
