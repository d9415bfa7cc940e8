"""Video-like visual tokens for benchmarks: objects on a grid, camera pan, noise and scene cuts."""

from __future__ import annotations

import math

import torch


def video_tokens(groups: int, tokens: int, dim: int, seed: int = 0, cut_every: int = 24) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(features (T, N, D), saliency (T, N), grid) with the redundancy structure of real video tokens.

    Each scene is a smooth map of a few object prototypes on the H x W grid; frames pan across it
    by one token every few groups, with per-frame noise; a new scene starts every `cut_every`
    groups. Saliency is higher on one "foreground" object.
    """
    g = torch.Generator().manual_seed(seed)
    h = int(math.isqrt(tokens))
    while tokens % h:
        h -= 1
    w = tokens // h
    frames = []
    saliency = []
    for start in range(0, groups, cut_every):
        length = min(cut_every, groups - start)
        protos = torch.randn(8, dim, generator=g)
        width = w + length  # room to pan
        logits = torch.randn(8, h, width, generator=g)
        logits = torch.nn.functional.avg_pool2d(logits[None], 3, stride=1, padding=1)[0] * 6
        mix = torch.softmax(logits, 0)  # (8, h, width)
        field = torch.einsum("phw,pd->hwd", mix, protos)
        fg = mix[0]
        for i in range(length):
            shift = i // 3
            frame = field[:, shift : shift + w].reshape(tokens, dim)
            frames.append(frame + 0.25 * torch.randn(tokens, dim, generator=g))
            saliency.append((0.05 + fg[:, shift : shift + w]).reshape(tokens) * torch.rand(tokens, generator=g))
    return torch.stack(frames), torch.stack(saliency), (h, w)
