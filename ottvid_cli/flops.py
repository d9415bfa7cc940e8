"""Exact FLOP counts of Qwen2.5-VL's LLM prefill and vision encoder, from the config and the input size.

A matrix product of (m x k) by (k x n) counts 2*m*k*n FLOPs (a multiply and an add); norms,
activations, softmax, rotary embeddings and bias additions are left out (they are
element-wise and below 1% here). Attention counts the full L x L score and value products
(QK^T and AV), as dense kernels compute them; causal masking is not subtracted. The formulas are
written out in docs/profile.md, and a test checks them against PyTorch's FlopCounterMode.
"""

from __future__ import annotations

from typing import Sequence


def llm_prefill_flops(text_config, seq_len: int, logits_positions: int = 1) -> float:
    """FLOPs of one prefill forward over `seq_len` tokens, with the LM head on `logits_positions` tokens.

    Per layer, with hidden h, query heads a, key/value heads g, head dim d, MLP width i:
      projections 2L(h*a*d) + 2*2L(h*g*d) + 2L(a*d*h); attention 2*2*a*L^2*d; gated MLP 3*2L*h*i.
    Plus the LM head, 2*h*V per position that gets logits (generation needs only the last).
    """
    h = text_config.hidden_size
    a = text_config.num_attention_heads
    g = getattr(text_config, "num_key_value_heads", None) or a
    d = getattr(text_config, "head_dim", None) or h // a
    i = text_config.intermediate_size
    n = text_config.num_hidden_layers
    length = seq_len
    projections = 2 * length * h * a * d + 2 * 2 * length * h * g * d + 2 * length * a * d * h
    attention = 2 * 2 * a * length * length * d
    mlp = 3 * 2 * length * h * i
    head = 2 * logits_positions * h * text_config.vocab_size
    return float(n * (projections + attention + mlp) + head)


def vision_flops(vision_config, grid_thw: Sequence[int], window_lengths: Sequence[int]) -> float:
    """FLOPs of the vision encoder on one video of (t, h, w) patches.

    S = t*h*w patches of width C, MLP width I: patch embedding 2*S*(3*tp*p*p)*C; per block qkv
    2*S*C*3C, output 2*S*C*C, gated MLP 3*2*S*C*I, attention 2*2*C*sum(segment^2) where segments
    are the windows (`window_lengths`, in patches) for windowed blocks and one temporal group
    (h*w) for full-attention blocks; merger MLP on S/m^2 tokens: 2*(S/m^2)*(m^2 C)^2 +
    2*(S/m^2)*(m^2 C)*out.
    """
    t, hp, wp = (int(v) for v in grid_thw)
    s = t * hp * wp
    c = vision_config.hidden_size
    inner = vision_config.intermediate_size
    unit = vision_config.spatial_merge_size ** 2
    patch = vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size ** 2
    full_blocks = set(vision_config.fullatt_block_indexes)
    dense = 2 * s * c * 3 * c + 2 * s * c * c + 3 * 2 * s * c * inner
    full_attention = 2 * 2 * c * t * (hp * wp) ** 2
    window_attention = 2 * 2 * c * sum(int(n) ** 2 for n in window_lengths)
    blocks = sum(dense + (full_attention if b in full_blocks else window_attention)
                 for b in range(vision_config.depth))
    merged = s // unit
    merger = 2 * merged * (unit * c) ** 2 + 2 * merged * unit * c * vision_config.out_hidden_size
    return float(2 * s * patch * c + blocks + merger)


def siglip_video_flops(vision_config, frames: int, text_hidden: int, feature_layers: int = 1) -> float:
    """FLOPs of LLaVA-OneVision's SigLIP tower and projector on `frames` frames.

    Per frame, S = (image/patch)^2 patches of width C, MLP width I: patch embedding 2*S*(3*p*p)*C;
    per layer q/k/v/o 4*2*S*C*C, attention 2*2*C*S^2, MLP 2*2*S*C*I; projector 2*S*(C*layers)*H +
    2*S*H*H (H the LLM width). The 2x2 bilinear pooling has no matrix products.
    """
    s = (vision_config.image_size // vision_config.patch_size) ** 2
    c, inner = vision_config.hidden_size, vision_config.intermediate_size
    embed = 2 * s * vision_config.num_channels * vision_config.patch_size ** 2 * c
    layer = 4 * 2 * s * c * c + 2 * 2 * c * s * s + 2 * 2 * s * c * inner
    projector = 2 * s * c * feature_layers * text_hidden + 2 * s * text_hidden * text_hidden
    return float(frames * (embed + vision_config.num_hidden_layers * layer + projector))
