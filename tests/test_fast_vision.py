"""The vision towers at their arithmetic (backbones/fast_vision.py): the swapped modules give the
stock tower's features (float32 on the CPU: <= 1e-5 relative), through the loading path users take; the
Triton kernels (Triton's interpreter on CPU tensors, compiled on a GPU) compute the PyTorch arithmetic."""

import os

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter, set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from ottvid_cli.tiny import build_tiny_qwen2_5_vl, build_tiny_qwen3_vl
from torch import nn

from ottvid_cli.backbones import fast_vision
from ottvid_cli.backbones.attention import use_packed_vision
from ottvid_cli.backbones.fast_vision import MatmulPatchEmbed, PaddedGatedMLP, PaddedMLP, kernels_run, speed_up_vision
from ottvid_cli.compression.backend import interpreter_problem, interpreting, triton_importable


def _kernel_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not triton_importable():
        pytest.skip("triton is not installed")
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (run this file on its own)")
    if interpreter_problem():
        pytest.skip(interpreter_problem())
    return torch.device("cpu")


@pytest.fixture(scope="module")
def odd_qwen(tmp_path_factory):
    """A tiny Qwen2.5-VL whose vision MLP width (100) is no multiple of 64, as the 7B's 3,420."""
    path = tmp_path_factory.mktemp("odd-qwen")
    return build_tiny_qwen2_5_vl(path, vision={"intermediate_size": 100})


@pytest.fixture(scope="module")
def odd_qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd-qwen3")
    return build_tiny_qwen3_vl(path, vision={"intermediate_size": 72})


def _model(path, qwen3: bool = False):
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    cls = Qwen3VLForConditionalGeneration if qwen3 else Qwen2_5_VLForConditionalGeneration
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    assert use_packed_vision(model)
    return model


def _video(model, groups: int = 2, side: int = 4, seed: int = 0):
    """pixel_values_videos and video_grid_thw of a random video: `groups` temporal groups of side x side
    patches."""
    vision = model.config.vision_config
    grid = torch.tensor([[groups, side, side]])
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    pixels = torch.randn(groups * side * side, width, generator=torch.Generator().manual_seed(seed))
    return pixels, grid


def _features(model, pixels, grid):
    with torch.inference_mode():
        out = model.model.get_video_features(pixel_values_videos=pixels, video_grid_thw=grid)
    main = torch.cat(list(out.pooler_output)) if isinstance(out.pooler_output, (tuple, list)) else out.pooler_output
    extra = [torch.cat(list(layer)) if isinstance(layer, (tuple, list)) else layer
             for layer in (getattr(out, "deepstack_features", None) or [])]
    return [main, *extra]


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> float:
    gap = float((a.detach() - b.detach()).abs().max() / b.detach().abs().max())
    assert gap <= rel, gap
    return gap


@pytest.mark.parametrize("qwen3", [False, True], ids=["qwen2.5-vl", "qwen3-vl"])
def test_swapped_tower_gives_the_stock_features(odd_qwen, odd_qwen3, qwen3):
    path = odd_qwen3 if qwen3 else odd_qwen
    stock, fast = _model(path, qwen3), _model(path, qwen3)
    done = speed_up_vision(fast, kernels=False)
    assert "patch embedding as a matrix product" in done and "MLP inner width padded to a multiple of 64" in done
    tower = fast.model.visual
    assert isinstance(tower.patch_embed, MatmulPatchEmbed)
    mlp = tower.blocks[0].mlp
    assert isinstance(mlp, PaddedMLP if qwen3 else PaddedGatedMLP)
    width = mlp.linear_fc1.out_features if qwen3 else mlp.width
    assert width % 64 == 0 and width >= (72 if qwen3 else 100)
    assert speed_up_vision(fast) is done  # idempotent
    for groups, side in ((2, 4), (3, 6)):  # the window layout of the odd grid has unequal segments
        pixels, grid = _video(stock, groups, side)
        for got, want in zip(_features(fast, pixels, grid), _features(stock, pixels, grid), strict=True):
            assert got.shape == want.shape
            _close(got, want)


def test_parameters_are_the_models_own_but_the_padded_mlp(odd_qwen):
    model = _model(odd_qwen)
    tower = model.model.visual
    conv = tower.patch_embed.proj.weight
    qkv = tower.blocks[0].attn.qkv.weight
    norm = tower.blocks[0].norm1.weight
    speed_up_vision(model, kernels=False)
    assert tower.patch_embed.proj.weight is conv and tower.blocks[0].attn.qkv.weight is qkv
    assert tower.blocks[0].norm1.weight is norm
    names = dict(model.named_parameters())
    assert "model.visual.blocks.0.mlp.gate_up.weight" in names and "model.visual.blocks.0.mlp.gate_proj.weight" not in names


def test_padded_units_are_exactly_zero():
    torch.manual_seed(0)
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = nn.Linear(8, 10), nn.Linear(8, 10), nn.Linear(10, 8)
    mlp.act_fn = nn.SiLU()
    padded = PaddedGatedMLP(mlp, kernels=False)
    x = torch.randn(5, 8)
    inner = padded.act_fn(padded.gate_up(x)[:, :64]) * padded.gate_up(x)[:, 64:]
    assert torch.equal(inner[:, 10:], torch.zeros(5, 54))
    want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
    _close(padded(x), want, 1e-6)


def test_padding_refuses_an_activation_not_zero_at_zero():
    mlp = nn.Module()
    mlp.linear_fc1, mlp.linear_fc2, mlp.act_fn = nn.Linear(8, 10), nn.Linear(10, 8), nn.Sigmoid()
    with pytest.raises(ValueError, match="not 0 at 0"):
        PaddedMLP(mlp)


def test_patch_embedding_refuses_an_overlapping_convolution():
    original = nn.Module()
    original.proj = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 2, 2))
    with pytest.raises(ValueError, match="one-patch-per-step"):
        MatmulPatchEmbed(original)


def test_patch_embedding_as_a_product_is_the_convolution():
    torch.manual_seed(0)
    original = nn.Module()
    original.proj = nn.Conv3d(3, 16, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=True)
    x = torch.randn(7, 3 * 2 * 14 * 14)
    want = original.proj(x.view(-1, 3, 2, 14, 14)).view(-1, 16)
    _close(MatmulPatchEmbed(original)(x), want, 1e-6)


def test_nothing_changes_for_a_tower_without_packed_attention(odd_qwen):
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(odd_qwen, attn_implementation="sdpa")
    assert speed_up_vision(model) == []
    assert not isinstance(model.model.visual.patch_embed, MatmulPatchEmbed)


def test_when_load_swaps(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(fast_vision.ENV, raising=False)
    assert fast_vision.enabled(cuda) and not fast_vision.enabled(cpu)
    monkeypatch.setenv(fast_vision.ENV, "1")
    assert fast_vision.enabled(cpu)
    monkeypatch.setenv(fast_vision.ENV, "off")
    assert not fast_vision.enabled(cuda)


def test_load_swaps_on_request_and_answers_as_stock(odd_qwen, monkeypatch):
    """Through `Qwen25VL.load`, the path users take: encode (features and saliency) as the stock tower."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    from ottvid_cli.video import sample_frames

    clip = sample_frames(os.path.join(os.path.dirname(__file__), "data", "cockatoo.mp4"), 4)
    monkeypatch.setenv(fast_vision.ENV, "0")
    stock = Qwen25VL.load(str(odd_qwen), device="cpu", dtype="float32")
    monkeypatch.setenv(fast_vision.ENV, "1")
    fast = Qwen25VL.load(str(odd_qwen), device="cpu", dtype="float32")
    assert isinstance(fast.model.model.visual.patch_embed, MatmulPatchEmbed)
    assert not isinstance(stock.model.model.visual.patch_embed, MatmulPatchEmbed)
    inputs = stock.preprocess(clip.frames, clip.timestamps, clip.duration, "What happens?")
    a, b = fast.encode(inputs), stock.encode(inputs)
    _close(a.features, b.features)
    _close(a.saliency, b.saliency)


# ------------------------------------------------------------------------------------------------
# the kernels against the PyTorch arithmetic


def _ulps_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bfloat16 steps (same-sign values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def _steps(device: torch.device, compiled: int) -> int:
    """bfloat16 steps allowed: `compiled` for compiled kernels; in Triton's interpreter one more per
    rounding, since it truncates float32 -> bfloat16 where compiled code (and PyTorch) rounds to nearest."""
    return compiled if device.type == "cuda" else compiled + 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel(dtype):
    from ottvid_cli.backbones.vision_kernels import rms_norm

    device = _kernel_device()
    torch.manual_seed(0)
    norm = nn.Module()
    norm.weight, norm.variance_epsilon = nn.Parameter(torch.randn(80, dtype=dtype, device=device)), 1e-6
    x = (torch.randn(37, 80, device=device) * 3).to(dtype)
    want = fast_vision.KernelRMSNorm(norm, kernels=False)(x)
    got = rms_norm(x, norm.weight, 1e-6)
    if dtype == torch.float32:
        _close(got, want, 1e-6)
    else:  # the variance's sum in another order: a step on rare values (two after the weight's product)
        assert int(_ulps_bf16(got, want).max()) <= _steps(device, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_kernel(dtype):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    from ottvid_cli.backbones.vision_kernels import rotary

    device = _kernel_device()
    torch.manual_seed(0)
    tokens, heads, dim = 29, 3, 20  # neither a power of two
    qkv = torch.randn(tokens, 3 * heads * dim, device=device).to(dtype)
    angles = torch.randn(tokens, dim // 2, device=device) * 4
    emb = torch.cat([angles, angles], -1)
    cos, sin = emb.cos(), emb.sin()
    q, k, _ = qkv.view(tokens, 3, heads, dim).unbind(1)
    want_q, want_k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    got_q, got_k = rotary(qkv, heads, cos, sin)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert got.dtype == dtype and got.shape == (tokens, heads, dim)
        if dtype == torch.float32:
            _close(got, want, 1e-6)
        else:  # float32 products and sums, one rounding: PyTorch's, compiled
            assert int(_ulps_bf16(got, want).max()) <= _steps(device, 0) - (device.type != "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_kernel(dtype):
    from ottvid_cli.backbones.vision_kernels import silu_mul

    device = _kernel_device()
    torch.manual_seed(0)
    gate_up = (torch.randn(13, 2 * 1100, device=device) * 4).to(dtype)  # spans two column blocks
    want = nn.functional.silu(gate_up[:, :1100]) * gate_up[:, 1100:]
    got = silu_mul(gate_up)
    if dtype == torch.float32:
        _close(got, want, 1e-6)
    else:  # exp's approximation: a step on rare values (two after the product with up)
        assert int(_ulps_bf16(got, want).max()) <= _steps(device, 2)


@pytest.mark.parametrize("qwen3", [False, True], ids=["qwen2.5-vl", "qwen3-vl"])
def test_tower_with_kernels_gives_the_stock_features(odd_qwen, odd_qwen3, monkeypatch, qwen3):
    """Every kernel inside the tower (interpreter on CPU, compiled on a GPU), at float32 (cuDNN's TF32
    off: the stock Conv3d would otherwise round its inputs to 10 bits). Qwen3-VL: the rotary kernel (its
    LayerNorm and GELU MLP stay PyTorch's), DeepStack outputs included."""
    device = _kernel_device()
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    path = odd_qwen3 if qwen3 else odd_qwen
    stock, fast = _model(path, qwen3).to(device), _model(path, qwen3).to(device)
    done = speed_up_vision(fast, kernels=True)
    assert "packed attention with a fused rotary embedding" in done
    assert ("RMSNorm in one kernel" in done) is not qwen3
    assert qwen3 or fast.model.visual.blocks[0].mlp.kernels
    pixels, grid = _video(stock, 2, 4)
    for got, want in zip(_features(fast, pixels.to(device), grid.to(device)),
                         _features(stock, pixels.to(device), grid.to(device)), strict=True):
        _close(got, want)


def test_kernels_refused_where_they_cannot_run(odd_qwen, monkeypatch):
    monkeypatch.setattr(fast_vision, "kernels_run", lambda device: False)
    with pytest.raises(ValueError, match="do not run"):
        speed_up_vision(_model(odd_qwen), kernels=True)
    assert kernels_run(torch.device("meta")) is False
