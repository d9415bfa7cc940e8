"""One video's embeddings compressed by a registered method, with the trained positions attached, as
vLLM's path for pruned media carries them (docs/vllm.md). Torch only: no vLLM import.

vLLM's own pruning (EVS) appends 4 channels to each kept embedding, (t, h, w, W') in the embeddings'
dtype, which `recompute_mrope_positions` strips and turns into the positions. Two things there are not
the rule Qwen2.5-VL was trained with (docs/positions.md): the text after the video starts at
`start + W'` instead of the largest position of the whole video + 1, and the positions pass through
the model's dtype (bfloat16 holds integers exactly only up to 256). So the embeddings here carry
POSITION_CHANNELS channels instead: each of (t, h, w, next) relative to the video's start, as
DIGITS base-256 digits (0..255, exact in every float dtype), and the model's `recompute_mrope_positions`
decodes them into the 4-channel form vLLM's function takes, with `next` in place of W', so that the
text that follows lands where vLLM puts it, at start + channel 3: the trained position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...backbones.positions import vision_positions
from ...compression import methods
from ...compression.ottvid import Compressed

DIGITS = 3  # base-256 digits per position: positions below 2**24
BASE = 256
POSITION_CHANNELS = 4 * DIGITS


def retained(ratio: float, groups: int, tokens: int) -> int:
    """Video placeholders, and tokens the method returns: max(1, round(ratio x V)), V = groups x tokens
    (vLLM's EVS keeps max(tokens, int(V (1 - q))) instead: at least one whole group, truncated)."""
    return methods.target_count(ratio, groups, tokens)


def encode_positions(positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(K, M) non-negative long values (positions and counts) -> (M, K x DIGITS) base-256 digits in
    `dtype`, most significant first. ValueError past 256**DIGITS."""
    if positions.numel() and int(positions.max()) >= BASE**DIGITS:
        raise ValueError(f"a position of {int(positions.max())} does not fit {DIGITS} base-{BASE} digits")
    powers = BASE ** torch.arange(DIGITS - 1, -1, -1, device=positions.device)  # (DIGITS,)
    digits = (positions.long().unsqueeze(-1) // powers) % BASE  # (K, M, DIGITS)
    return digits.permute(1, 0, 2).reshape(positions.shape[1], -1).to(dtype)


def decode_positions(channels: torch.Tensor) -> torch.Tensor:
    """(M, K x DIGITS) digits (any float dtype) -> (K, M) long values."""
    digits = channels.float().round().long().reshape(channels.shape[0], -1, DIGITS)
    powers = BASE ** torch.arange(DIGITS - 1, -1, -1, device=channels.device)
    return (digits * powers).sum(-1).t()


def run_method(embeds: torch.Tensor, grid: tuple[int, int, int], saliency: torch.Tensor | None, method: str,
               config: Any) -> Compressed:
    """The method on one video's merged tokens `embeds` (V, D), raster order, V = T' H' W' of the merged
    `grid`; saliency (V,) or None. Checks that the output can keep M-RoPE positions (each row at its
    root's: no reordered layout) and fills exactly the prompt's `retained` placeholders."""
    t, h, w = (int(v) for v in grid)
    if embeds.dim() != 2 or embeds.shape[0] != t * h * w:
        raise ValueError(f"embeds must be ({t * h * w}, D) for the merged grid {t}x{h}x{w}, "
                         f"got {tuple(embeds.shape)}")
    sal = None if saliency is None else saliency.reshape(t, h * w)
    out = methods.get(method).fn(embeds.reshape(t, h * w, -1), sal, (h, w), config)
    if out.order is not None:  # positions come from each row's root: a reordered layout has none to give
        raise ValueError(f"{method} with a reordered output (layout='official') cannot keep M-RoPE positions; "
                         f"use its default layout")
    want = retained(config.ratio, t, h * w)
    if out.index.numel() != want:
        raise ValueError(f"{method} returned {out.index.numel()} tokens where the prompt holds {want} "
                         f"placeholders (set its exact option to true)")
    return out


def compress_video(embeds: torch.Tensor, grid: tuple[int, int, int], saliency: torch.Tensor | None,
                   second_per_grid: float, tokens_per_second: float, method: str, config: Any,
                   ) -> tuple[torch.Tensor, Compressed]:
    """Compress one Qwen2.5-VL video's merged tokens and attach their positions.

    embeds: (V, D) the encoder's output for the video, raster order (t, row, col), V = T' H' W';
    grid: the merged grid (T', H', W'); saliency: (V,) or None. Returns the (M, D + POSITION_CHANNELS)
    tensor vLLM's pipeline carries (features in `embeds`' dtype, then the encoded positions: each kept
    or merged token at its root's (t, h, w), M = `retained`) and the method's `Compressed`.
    """
    t, h, w = (int(v) for v in grid)
    out = run_method(embeds, grid, saliency, method, config)
    want = out.index.numel()
    full = vision_positions(0, (t, h, w), second_per_grid, tokens_per_second, device=embeds.device)  # (3, V)
    following = full.max() + 1  # the text after the video: largest position of the whole video + 1
    kept = torch.cat([full[:, out.index.to(embeds.device)], following.expand(1, want)])  # (4, M)
    return torch.cat([out.features.to(embeds.dtype), encode_positions(kept, embeds.dtype)], 1), out


def image_channels(grid: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (H' W', POSITION_CHANNELS) positions of an image's merged tokens (no time axis; the text after
    it at max(H', W'), the largest position + 1), for a model whose pruning is on."""
    t, h, w = (int(v) for v in grid)
    full = vision_positions(0, (t, h, w), 0.0, 0.0, device=device)
    following = (full.max() + 1).expand(1, full.shape[1])
    return encode_positions(torch.cat([full, following]), dtype)


def first_positions(n: int, items: Sequence[tuple[int, int, int, torch.Tensor | None]]) -> tuple[torch.Tensor, int]:
    """A prompt's M-RoPE positions (3, n) before its media are encoded, and their delta (largest + 1 - n).

    items: (start, length, following, rows) of each image or video placeholder: `following`, where what
    follows the item starts relative to its first position (the uncompressed item's largest + 1); rows,
    its exact (3, length) positions relative to that, or None for a compressed video, whose rows only the
    method's decisions give (the model's `recompute_mrope_positions` places them before they are used;
    until then they hold first + min(i, following - 1)). Text is one position a token. What follows each
    item is at its trained place already here, so text after a video whose tokens vLLM's prefix cache
    holds (and never hands to `recompute_mrope_positions` again) is where it would be without the cache.
    """
    out = torch.empty(3, n, dtype=torch.long)
    position = cursor = 0
    for start, length, following, rows in sorted(items, key=lambda item: item[0]):
        out[:, cursor:start] = torch.arange(position, position + start - cursor)
        position += start - cursor
        if rows is None:
            rows = torch.arange(length).clamp(max=max(following - 1, 0)).expand(3, length)
        out[:, start:start + length] = rows + position
        position += following
        cursor = start + length
    out[:, cursor:] = torch.arange(position, position + n - cursor)
    return out, (int(out.max()) + 1 - n) if n else 0


def prompt_positions(n: int, features: Sequence[Any], merge: int,
                     video_following: Callable[[tuple[int, int, int], Any], int]) -> tuple[torch.Tensor, int]:
    """`first_positions` of a prompt of n tokens from vLLM's multimodal features (`MultiModalFeatureSpec`:
    modality, mm_position, data): an image's rows exactly, a video's extent from `video_following(merged
    grid, the feature's data)`, the model's rule for where what follows the uncompressed video starts."""
    items = []
    for feature in features:
        data, start, length = feature.data, feature.mm_position.offset, feature.mm_position.length
        t, h, w = data[f"{feature.modality}_grid_thw"].data.tolist()
        grid = (int(t), int(h) // merge, int(w) // merge)
        if feature.modality == "video":
            items.append((start, length, video_following(grid, data), None))
        else:
            rows = vision_positions(0, grid, 0.0, 0.0)
            items.append((start, length, int(rows.max()) + 1, rows))
    return first_positions(n, items)
