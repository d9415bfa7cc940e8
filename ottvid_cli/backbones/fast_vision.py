"""The Qwen vision towers at their arithmetic (docs/gpu.md "Vision encoder").

transformers' Qwen2.5-VL / Qwen3-VL vision towers spend most of their time outside their matrix
products on a GPU: on an H200, 32 frames at 448 x 448 through the 7B's tower took 133 ms, of which the
MLP's three products with an inner width of 3,420 (not a multiple of 8, so cuBLAS falls back to a
2-element-aligned kernel) 58 ms, and ~50 ms went to ~1,000 small elementwise kernels (float32 RMSNorm and
rotary embedding done op by op). `speed_up_vision(model)` swaps, in place, the tower's submodules for
ones that compute the same thing with fewer, better-shaped kernels, through `nn.Module.set_submodule`
(no function of transformers is replaced; the blocks' own forward, hooks and outputs stay):

- patch embedding: the Conv3d whose kernel equals its stride, as one matrix product with the same
  weight (`MatmulPatchEmbed`);
- MLP: gate and up projections as one product, the inner width padded with zeros to a multiple of 64
  (the padded units are exactly 0: act(0) = 0 and their down-projection columns are 0)
  (`PaddedGatedMLP`, `PaddedMLP`);
- RMSNorm (Qwen2.5-VL), rotary embedding of q and k, silu(gate) * up: one Triton kernel each on CUDA
  (`vision_kernels`), transformers' own arithmetic elsewhere;
- attention: the packed segments in one call per block (`attention.packed_sdpa`, as before).

Features equal the stock tower's within rounding (tests/test_fast_vision.py: at float32 on the CPU,
<= 1e-5 relative; the kernels against the PyTorch arithmetic in Triton's interpreter). Parameters are
shared with the loaded model except the MLP's, which are replaced by their padded copies (the originals
are released). `load` swaps them on CUDA, where they were measured; OTTVID_FAST_VISION=1 swaps them on
every device, =0 on none.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import PACKED, attend

ENV = "OTTVID_FAST_VISION"
MULTIPLE = 64  # the MLP's inner width is padded to a multiple of this


def enabled(device: torch.device) -> bool:
    """Whether `load` swaps the modules for a model on `device`: OTTVID_FAST_VISION 1 / 0 (true / false,
    yes / no, on / off) decides; unset, on CUDA only."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return device.type == "cuda"


def kernels_run(device: torch.device) -> bool:
    """Whether the Triton kernels can run for tensors on `device`: compiled on CUDA, or in Triton's
    interpreter on CPU tensors (how the tests run them; never chosen by default there, it is slow)."""
    from ..compression.backend import interpreter_problem, interpreting, triton_importable

    if device.type == "cuda":
        return triton_importable()
    return device.type == "cpu" and interpreting() and interpreter_problem() is None


class MatmulPatchEmbed(nn.Module):
    """A Conv3d patch embedding whose kernel equals its stride (each patch seen once) as one matrix
    product: (patches, C * t * p * p) @ W.view(D, -1).T (+ bias). `proj` is the original Conv3d, so the
    parameters and their names are the model's own."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.proj = original.proj
        if tuple(self.proj.kernel_size) != tuple(self.proj.stride) or any(self.proj.padding) \
                or any(d != 1 for d in self.proj.dilation) or self.proj.groups != 1:
            raise ValueError("the patch embedding is not a one-patch-per-step Conv3d")
        self.embed_dim = self.proj.out_channels

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        flat = weight.reshape(weight.shape[0], -1)  # (D, C * t * p * p), the order of the input's rows
        return F.linear(hidden_states.reshape(-1, flat.shape[1]).to(weight.dtype), flat, self.proj.bias)


def _padded(width: int, multiple: int = MULTIPLE) -> int:
    return -(-width // multiple) * multiple


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _is_silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


class PaddedGatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up as one product of inner width padded to a multiple of
    64 (zero rows: the padded units are act(0) * 0 = 0 and their down columns are zero, so the result is
    the unpadded one). silu * up in one Triton kernel where it runs."""

    def __init__(self, mlp: nn.Module, kernels: bool, multiple: int = MULTIPLE):
        super().__init__()
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        width, hidden = gate.out_features, gate.in_features
        self.width = padded = _padded(width, multiple)
        weight = gate.weight.new_zeros(2 * padded, hidden)
        weight[:width], weight[padded:padded + width] = gate.weight, up.weight
        bias = None
        if gate.bias is not None:
            bias = gate.bias.new_zeros(2 * padded)
            bias[:width], bias[padded:padded + width] = gate.bias, up.bias
        self.gate_up = _linear(weight, bias)
        down_weight = down.weight.new_zeros(hidden, padded)
        down_weight[:, :width] = down.weight
        self.down = _linear(down_weight, down.bias)
        self.act_fn = mlp.act_fn
        self.kernels = kernels and _is_silu(mlp.act_fn)

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(hidden_state)
        if self.kernels and gate_up.dim() == 2:
            from .vision_kernels import silu_mul

            return self.down(silu_mul(gate_up))
        return self.down(self.act_fn(gate_up[..., :self.width]) * gate_up[..., self.width:])


class PaddedMLP(nn.Module):
    """fc2(act(fc1(x))) with the inner width padded to a multiple of 64 (zero rows and columns; act(0) = 0
    is checked, so the padded units add nothing)."""

    def __init__(self, mlp: nn.Module, multiple: int = MULTIPLE):
        super().__init__()
        fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
        width = fc1.out_features
        padded = _padded(width, multiple)
        zero = mlp.act_fn(torch.zeros(1, dtype=fc1.weight.dtype, device=fc1.weight.device))
        if bool(zero.ne(0).any()):
            raise ValueError("the MLP's activation is not 0 at 0: its width cannot be padded")
        weight = fc1.weight.new_zeros(padded, fc1.in_features)
        weight[:width] = fc1.weight
        bias = None
        if fc1.bias is not None:
            bias = fc1.bias.new_zeros(padded)
            bias[:width] = fc1.bias
        self.linear_fc1 = _linear(weight, bias)
        out_weight = fc2.weight.new_zeros(fc2.out_features, padded)
        out_weight[:, :width] = fc2.weight
        self.linear_fc2 = _linear(out_weight, fc2.bias)
        self.act_fn = mlp.act_fn

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(hidden_state)))


class KernelRMSNorm(nn.Module):
    """Qwen2.5-VL's RMSNorm (the model's own weight): one Triton kernel where it runs, else the same
    arithmetic as transformers' module (float32 statistics, rounded to the input dtype, times the weight)."""

    def __init__(self, norm: nn.Module, kernels: bool):
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = norm.variance_epsilon
        self.kernels = kernels

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.kernels:
            from .vision_kernels import rms_norm

            return rms_norm(hidden_states, self.weight, self.variance_epsilon)
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)  # x / RMS(x)
        return self.weight * x.to(dtype)


class PackedRotaryAttention(nn.Module):
    """A Qwen vision attention (qkv -> rotary -> attention within `cu_seqlens` segments -> proj) with the
    rotary embedding in one Triton kernel where it runs (else the model's own
    `apply_rotary_pos_emb_vision`) and the segments in one `packed_sdpa` call. Called exactly as the
    original (its hooks' arguments are the same); `qkv`, `proj`, `num_heads`, `scaling` are the
    original's."""

    def __init__(self, attn: nn.Module, kernels: bool):
        super().__init__()
        self.qkv, self.proj = attn.qkv, attn.proj
        self.num_heads, self.head_dim, self.scaling = attn.num_heads, attn.head_dim, attn.scaling
        self.config = attn.config
        self.reference = sys.modules[type(attn).__module__].apply_rotary_pos_emb_vision
        self.kernels = kernels

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                max_seqlen: int | None = None, **kwargs: Any) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        qkv = self.qkv(hidden_states)
        cos, sin = position_embeddings
        query, key, values = qkv.view(tokens, 3, self.num_heads, -1).unbind(1)  # views, (S, heads, d) each
        if self.kernels:
            from .vision_kernels import rotary

            query, key = rotary(qkv, self.num_heads, cos, sin)
        else:
            query, key = self.reference(query, key, cos, sin)
        out = attend(self, query, key, values, cu_seqlens, self.scaling)  # (S, heads, d); records under `recording`
        return self.proj(out.reshape(tokens, -1))


def _tower(model: Any) -> nn.Module | None:
    inner = getattr(model, "model", model)
    return getattr(inner, "visual", None)


def speed_up_vision(model: Any, kernels: bool | None = None) -> list[str]:
    """Swap the submodules of a Qwen2.5-VL / Qwen3-VL vision tower (`model.model.visual`) for the faster
    equivalents above; returns what was done ([] when nothing applies: another tower, or one whose
    attention is not the packed one, `attention.use_packed_vision`). kernels: use the Triton kernels
    (default: on CUDA where Triton imports). In place; idempotent."""
    tower = _tower(model)
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    if tower is None or vision is None or getattr(vision, "_attn_implementation", None) != PACKED:
        return []
    if getattr(tower, "ottvid_fast", None) is not None:
        return tower.ottvid_fast
    device = next(tower.parameters()).device
    if kernels is None:
        kernels = device.type == "cuda" and kernels_run(device)
    elif kernels and not kernels_run(device):
        raise ValueError(f"the vision kernels do not run on {device.type} tensors here")
    done: list[str] = []
    patch = getattr(tower, "patch_embed", None)
    if patch is not None and isinstance(getattr(patch, "proj", None), nn.Conv3d):
        tower.set_submodule("patch_embed", MatmulPatchEmbed(patch))
        done.append("patch embedding as a matrix product")
    with torch.no_grad():
        for i, block in enumerate(tower.blocks):
            name = f"blocks.{i}"
            mlp = block.mlp
            if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
                tower.set_submodule(f"{name}.mlp", PaddedGatedMLP(mlp, kernels))
            elif all(hasattr(mlp, n) for n in ("linear_fc1", "linear_fc2")):
                tower.set_submodule(f"{name}.mlp", PaddedMLP(mlp))
            for norm in ("norm1", "norm2"):
                if type(getattr(block, norm)).__name__.endswith("RMSNorm"):
                    tower.set_submodule(f"{name}.{norm}", KernelRMSNorm(getattr(block, norm), kernels))
            tower.set_submodule(f"{name}.attn", PackedRotaryAttention(block.attn, kernels))
        merger = getattr(tower, "merger", None)
        if merger is not None and type(getattr(merger, "ln_q", None)).__name__.endswith("RMSNorm"):
            tower.set_submodule("merger.ln_q", KernelRMSNorm(merger.ln_q, kernels))
    if tower.blocks:
        done += ["MLP inner width padded to a multiple of 64", "packed attention with a fused rotary embedding"
                 if kernels else "packed attention"]
        if isinstance(tower.blocks[0].norm1, KernelRMSNorm):
            done.append("RMSNorm in one kernel" if kernels else "RMSNorm")
    tower.ottvid_fast = done
    return done
