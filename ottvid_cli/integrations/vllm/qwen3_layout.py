"""Qwen3-VL's compressed videos as vLLM's pruned-media path carries them (docs/vllm.md, "Qwen3-VL").
Torch only: no vLLM import.

In Qwen3-VL a video is text and vision interleaved: for each temporal group `<t seconds>`,
`<|vision_start|>`, the group's tokens, `<|vision_end|>`. vLLM sizes the prompt before the encoder
runs, so its processor writes all of a video's placeholders in the first group's block (the "lumped"
placeholder: `[count] + [0] * (T' - 1)`); the model returns embeddings for the whole placeholder, laid
out as the video really is. Ours is ottvid_cli's layout exactly: the uncompressed item with the
video tokens the method dropped removed, every timestamp and marker kept (docs/qwen3_vl.md).

Each row of an item carries VALUES values, as `pruning`'s base-256 digits (exact in every float dtype):
(t, h, w) its position relative to the item's first token (text keeps its uncompressed position, a
kept or merged token its root's); `next`, where what follows the item starts (the uncompressed item's
largest position + 1); `j`, the row's index in the item; `lead`, where the lumped run of video
placeholders starts in the item (the first group's timestamp tokens + 1; 0 for an image); `length`,
the item's rows. `place` turns them into the request's positions, a prefill chunk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...backbones.positions import sequence_positions, vision_positions
from . import pruning

VALUES = 7  # t, h, w, next, j, lead, length
CHANNELS = VALUES * pruning.DIGITS


def resize_video_runs(ids: Sequence[int], video_token: int, counts: Sequence[int]) -> list[int]:
    """`ids` with its k-th run of `video_token` made counts[k] long: vLLM's lumped placeholder, one run a
    video (its other groups' blocks are empty), sized by our count instead of vLLM's."""
    out: list[int] = []
    runs, i, n = 0, 0, len(ids)
    while i < n:
        if ids[i] != video_token:
            out.append(ids[i])
            i += 1
            continue
        while i < n and ids[i] == video_token:
            i += 1
        if runs >= len(counts):
            raise ValueError(f"the prompt holds more runs of video placeholders than its {len(counts)} videos")
        out.extend([video_token] * int(counts[runs]))
        runs += 1
    if runs != len(counts):
        raise ValueError(f"the prompt holds {runs} runs of video placeholders for {len(counts)} videos")
    return out


def item_positions(item_ids: torch.Tensor, video_token: int, grid: Sequence[int]) -> torch.Tensor:
    """(3, L) positions of an uncompressed video item relative to its first token: text one a token, each
    group its own (1, H', W') segment (`positions.sequence_positions`, Qwen3-VL's rule)."""
    t, h, w = (int(v) for v in grid)
    groups = iter([((1, h, w), 0.0)] * t)  # no time axis
    return sequence_positions((item_ids == video_token).long() * 2, groups, 0.0)


def video_layout(item_ids: torch.Tensor, video_token: int, vision_start: int, grid: Sequence[int],
                 index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A compressed video item: (its token ids (L',), its rows' values (VALUES, L') long).

    item_ids: (L,) the uncompressed item, every group's `<t seconds><|vision_start|>` + H' W' video
    tokens + `<|vision_end|>`; grid: the merged (T', H', W'); index: (M,) ascending flat indices
    t H' W' + n of the tokens the method returned (kept tokens, merged tokens' roots).
    """
    t, h, w = (int(v) for v in grid)
    device = item_ids.device
    is_video = item_ids == video_token
    slots = is_video.nonzero().flatten()
    if slots.numel() != t * h * w:
        raise ValueError(f"the item holds {slots.numel()} video tokens for a {t}x{h}x{w} grid")
    keep = ~is_video
    keep[slots[index.to(device)]] = True
    full = item_positions(item_ids, video_token, grid)  # (3, L), relative to the item's start
    rows = full[:, keep]
    length = rows.shape[1]
    lead = int((item_ids == vision_start).nonzero()[0]) + 1
    constant = torch.tensor([int(full.max()) + 1, 0, lead, length], device=device)[:, None].expand(4, length)
    values = torch.cat([rows, constant]).clone()
    values[4] = torch.arange(length, device=device)
    return item_ids[keep], values


def image_values(grid: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """(VALUES, H' W') of an image: its merged grid's (0, row, col), what follows at max(H', W')."""
    t, h, w = (int(v) for v in grid)
    rows = vision_positions(0, (t, h, w), 0.0, 0.0, device=device)
    length = rows.shape[1]
    constant = torch.tensor([int(rows.max()) + 1, 0, 0, length], device=device)[:, None].expand(4, length)
    values = torch.cat([rows, constant]).clone()
    values[4] = torch.arange(length, device=device)
    return values


def place(input_ids: torch.Tensor, pieces: Sequence[torch.Tensor], positions: torch.Tensor, computed: int,
          video_token: int, image_token: int) -> tuple[torch.Tensor, int]:
    """The request's M-RoPE positions (3, N) with the items of this prefill chunk placed, and the delta
    of the positions that follow the prompt (largest + 1 - N).

    input_ids: (N,) the whole prompt as vLLM holds it (lumped placeholders); pieces: each item's rows
    in this chunk, in sequence order, as (VALUES, rows) values (an item cut by the chunk's start begins
    at row j > 0, at `computed`); positions: (3, N) the request's positions so far (every position
    before `computed` is final; vLLM's may hold columns past the prompt, which are filled on and left
    out of the delta); computed: the prompt tokens already computed. Each item's rows go to
    base + (t, h, w), base = the largest earlier position + 1; what follows the item to base + next
    onward, one a token (a later item of the prompt is placed when its chunk comes).
    """
    positions = positions.clone()
    n = input_ids.numel()
    width = positions.shape[1]  # vLLM's first positions can run past the prompt (a lumped run under one group)
    cursor = computed
    for values in pieces:
        if values.shape[1] == 0:
            continue
        first, lead, length, following = (int(values[k, 0]) for k in (4, 5, 6, 3))
        if first > 0:  # the rest of an item begun in an earlier chunk: it continues at the chunk's start
            start = cursor - first
        elif lead > 0:  # a video: its lumped run of placeholders begins `lead` tokens into the item
            runs = ((input_ids == video_token).nonzero().flatten())
            later = runs[runs >= cursor + lead]
            if later.numel() == 0:
                raise ValueError("a video's rows have no placeholders left in the prompt")
            start = int(later[0]) - lead
        else:  # an image: its run of image tokens is the item
            runs = (input_ids == image_token).nonzero().flatten()
            later = runs[runs >= cursor]
            if later.numel() == 0:
                raise ValueError("an image's rows have no placeholders left in the prompt")
            start = int(later[0])
        base = int(positions[:, :start].max()) + 1 if start > 0 else 0
        lo = start + first
        positions[:, lo:lo + values.shape[1]] = values[:3].to(positions) + base
        end = start + length
        positions[:, end:] = torch.arange(base + following, base + following + width - end,
                                          device=positions.device, dtype=positions.dtype)
        cursor = lo + values.shape[1]
    return positions, int(positions[:, :n].max()) + 1 - n
