"""One item's embeddings (a compressed video, an image) with the trained positions attached, as vLLM's
path for pruned media carries them, and their placing in the request (docs/vllm.md). Torch only: no
vLLM import.

vLLM's own pruning (EVS) appends 4 or 5 channels to each row in the embeddings' dtype, which
`recompute_mrope_positions` strips and turns into positions. Not the rule the models were trained with
(docs/positions.md): for Qwen2.5-VL the text after a video starts at `start + W'` instead of the whole
video's largest position + 1; the positions pass through the model's dtype (bfloat16 holds integers
exactly only up to 256); and vLLM's function misplaces the second of two media in one prefill chunk
(it takes the first's `<|vision_start|>` again). So every row here carries VALUES values, as DIGITS
base-256 digits each (0..255, exact in every float dtype: CHANNELS channels): (t, h, w) its position
relative to the item's first token; `next`, where what follows the item starts (the uncompressed
item's largest position + 1); `j`, the row's index in the item; `lead`, where the item's run of
placeholders starts in it (Qwen3-VL's lumped run after the first timestamp; 0 when the item is its
run); `length`, the item's rows. The models' `recompute_mrope_positions` strip them and `place` them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...backbones.positions import vision_positions
from ...compression import methods
from ...compression.types import Compressed

DIGITS = 3  # base-256 digits per position: positions below 2**24
BASE = 256
VALUES = 7  # t, h, w, next, j, lead, length
CHANNELS = VALUES * DIGITS


def retained(method: str, config: Any, groups: int, tokens: int) -> int:
    """Video placeholders, and tokens the method returns: `methods.output_count` (the same function the
    method's count follows; for an exact method max(1, round(ratio x V)), V = groups x tokens, where vLLM's
    EVS keeps max(tokens, int(V (1 - q))): at least one whole group, truncated). ValueError for a config
    whose count depends on the content (`settings.read` refuses it at start-up)."""
    count = methods.output_count(method, config, groups, tokens)
    if count is None:
        raise ValueError(f"{method} with this config keeps a count that depends on the video")
    return count


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
    want = retained(method, config, t, h * w)
    if out.index.numel() != want:  # a method whose output disagrees with its own count rule: our bug
        raise RuntimeError(f"{method} returned {out.index.numel()} tokens where its count rule "
                           f"(methods.output_count) and the prompt say {want}")
    return out


def compress_video(embeds: torch.Tensor, grid: tuple[int, int, int], saliency: torch.Tensor | None,
                   second_per_grid: float, tokens_per_second: float, method: str, config: Any,
                   ) -> tuple[torch.Tensor, Compressed]:
    """Compress one Qwen2.5-VL video's merged tokens and attach their positions.

    embeds: (V, D) the encoder's output for the video, raster order (t, row, col), V = T' H' W';
    grid: the merged grid (T', H', W'); saliency: (V,) or None. Returns the (M, D + CHANNELS) tensor
    vLLM's pipeline carries (features in `embeds`' dtype, then the encoded values: each kept or merged
    token at its root's (t, h, w), what follows at the whole video's largest position + 1, M =
    `retained`) and the method's `Compressed`.
    """
    out = run_method(embeds, grid, saliency, method, config)
    full = vision_positions(0, grid, second_per_grid, tokens_per_second, device=embeds.device)  # (3, V)
    values = item_values(full[:, out.index.to(embeds.device)], int(full.max()) + 1)
    return torch.cat([out.features.to(embeds.dtype), encode_positions(values, embeds.dtype)], 1), out


def item_values(rows: torch.Tensor, following: int, lead: int = 0) -> torch.Tensor:
    """(VALUES, L) of an item whose rows sit at `rows` (3, L) relative to its first token, what follows it
    at `following`, its run of placeholders `lead` tokens in."""
    length = rows.shape[1]
    constant = torch.tensor([following, 0, lead, length], device=rows.device)[:, None].expand(4, length)
    values = torch.cat([rows.long(), constant]).clone()
    values[4] = torch.arange(length, device=rows.device)
    return values


def image_values(grid: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """(VALUES, H' W') of an image: its merged grid's (0, row, col), what follows at max(H', W')."""
    rows = vision_positions(0, grid, 0.0, 0.0, device=device)
    return item_values(rows, int(rows.max()) + 1)


def image_channels(grid: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (H' W', CHANNELS) encoded values of an image's merged tokens (`image_values`), for a model whose
    pruning is on."""
    return encode_positions(image_values(grid, device), dtype)


def place(input_ids: torch.Tensor, pieces: Sequence[torch.Tensor], positions: torch.Tensor, computed: int,
          video_token: int, image_token: int) -> tuple[torch.Tensor, int]:
    """The request's M-RoPE positions (3, N') with the items of this prefill chunk placed, and the delta
    of the positions that follow the prompt (largest + 1 - N, N the prompt's tokens).

    input_ids: (N,) the whole prompt as vLLM holds it; pieces: each item's rows in this chunk, in sequence
    order, as (VALUES, rows) values (an item cut by the chunk's start begins at row j > 0, at `computed`);
    positions: the request's positions so far (every position before `computed` is final; vLLM's may
    hold columns past the prompt, which are filled on and left out of the delta); computed: the prompt
    tokens already computed. An item starts `lead` tokens before the first image or video token at or
    after the end of the previous piece + `lead`; its rows go to base + (t, h, w), base = the largest
    earlier position + 1; what follows it to base + next onward, one a token (a later item of the prompt
    is placed when its chunk comes).
    """
    positions = positions.clone()
    n = input_ids.numel()
    width = positions.shape[1]
    media = ((input_ids == video_token) | (input_ids == image_token)).nonzero().flatten()
    cursor = computed
    for values in pieces:
        if values.shape[1] == 0:
            continue
        first, lead, length, following = (int(values[k, 0]) for k in (4, 5, 6, 3))
        if first > 0:  # the rest of an item begun in an earlier chunk: it continues at the chunk's start
            start = cursor - first
        else:
            later = media[media >= cursor + lead]
            if later.numel() == 0:
                raise ValueError("an item's rows have no placeholders left in the prompt")
            start = int(later[0]) - lead
        base = int(positions[:, :start].max()) + 1 if start > 0 else 0
        lo = start + first
        positions[:, lo:lo + values.shape[1]] = values[:3].to(positions) + base
        end = start + length
        positions[:, end:] = torch.arange(base + following, base + following + width - end,
                                          device=positions.device, dtype=positions.dtype)
        cursor = lo + values.shape[1]
    return positions, int(positions[:, :n].max()) + 1 - n


def recompute(input_ids: Any, embeddings: Sequence[torch.Tensor], positions: torch.Tensor, computed: int,
              video_token: int, image_token: int) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """A model's `recompute_mrope_positions` with a method asked for: the embeddings without their
    CHANNELS channels, the request's positions with this chunk's items placed (`place`), the delta."""
    device = positions.device
    ids = (input_ids if isinstance(input_ids, torch.Tensor)
           else torch.tensor(input_ids, dtype=torch.long)).to(device=device, dtype=torch.long)
    pieces = [decode_positions(mm[:, -CHANNELS:]).to(device) for mm in embeddings]
    placed, delta = place(ids, pieces, positions, int(computed), video_token, image_token)
    return [mm[:, :-CHANNELS] for mm in embeddings], placed, delta


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
            values = image_values(grid)
            items.append((start, length, int(values[3, 0]), values[:3]))
    return first_positions(n, items)
