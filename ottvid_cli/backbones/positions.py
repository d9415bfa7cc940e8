"""3-D M-RoPE positions by the rule Qwen2.5-VL was trained with (not the installed library's).

The rule (Qwen's training code: `get_rope_index_25` in qwen-vl-finetune's `qwenvl/data/rope2d.py`;
transformers 4.x and 5.2 agree on where the text after a video starts):

- text is 1-D: its three rows are equal and consecutive;
- a vision segment of merged grid (T', H', W') that starts at `s` (one past every position before
  it) puts its token (t, row, col), in raster order, at
  (s + floor(t * second_per_grid_t * tokens_per_second), s + row, s + col); an image has no time
  axis (interval 0);
- whatever follows starts at the **largest position so far + 1**.

transformers 5.23's `get_rope_index` starts the text after a video at `s + max(H', W')` instead,
inside the video's time axis; nothing here calls it. docs/positions.md has a worked example.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2  # mm_token_type_ids values


def vision_positions(start: int, grid: Sequence[int], second_per_grid_t: float, tokens_per_second: float,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """(3, T'*H'*W') positions of one vision segment with merged grid (T', H', W'), raster order.

    The temporal row is start + floor((t * second_per_grid_t) * tokens_per_second), evaluated in
    float32 in that order, as the training code does (second_per_grid_ts is a float32 tensor there;
    a different order or precision can land on the other side of an integer).
    """
    t, h, w = (int(v) for v in grid)
    seconds = torch.as_tensor(second_per_grid_t, dtype=torch.float32, device=device)
    times = ((torch.arange(t, device=device, dtype=torch.float32) * seconds) * tokens_per_second).long()
    rows = torch.arange(h, device=device)
    cols = torch.arange(w, device=device)
    return torch.stack(torch.meshgrid(times, rows, cols, indexing="ij")).reshape(3, -1) + start


def sequence_positions(token_types: torch.Tensor, vision: Iterator[tuple[Sequence[int], float]],
                       tokens_per_second: float) -> torch.Tensor:
    """Positions (3, L) of one unpadded sequence.

    token_types: (L,) 0 text, 1 image, 2 video (`mm_token_type_ids`); vision: yields, for each
    vision segment in sequence order, its merged grid (T', H', W') and seconds per temporal group
    (0 for an image). Vision segments back to back (no text between) are told apart by their
    token counts.
    """
    device = token_types.device
    length = token_types.numel()
    if length == 0:
        return torch.zeros(3, 0, dtype=torch.long, device=device)
    change = torch.ones(length, dtype=torch.bool, device=device)
    change[1:] = token_types[1:] != token_types[:-1]
    starts = change.nonzero().flatten().tolist() + [length]
    kinds = token_types[change].tolist()
    parts: list[torch.Tensor] = []
    nxt = 0  # largest position so far + 1
    for kind, lo, hi in zip(kinds, starts[:-1], starts[1:]):
        if kind == TEXT:
            parts.append(torch.arange(nxt, nxt + hi - lo, device=device).expand(3, -1))
            nxt += hi - lo
            continue
        while lo < hi:  # one or more vision segments
            try:
                grid, seconds = next(vision)
            except StopIteration:
                raise ValueError("the sequence holds more vision tokens than its vision grids describe") from None
            block = vision_positions(nxt, grid, seconds, tokens_per_second, device)
            if lo + block.shape[1] > hi:
                raise ValueError("a vision grid holds more tokens than its run of vision tokens")
            parts.append(block)
            nxt = int(block.max()) + 1
            lo += block.shape[1]
    return torch.cat(parts, dim=1)


def qwen2_5_vl_positions(
    mm_token_type_ids: torch.Tensor,
    spatial_merge_size: int,
    tokens_per_second: float,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
    image_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen2.5-VL's M-RoPE positions (3, B, L) by the trained rule (see the module docstring).

    `*_grid_thw` are the processor's patch grids, (N, 3) each (the merged grid divides H and W by
    `spatial_merge_size`); the sequences of the batch take the images and videos in order. Without
    `second_per_grid_ts` a video's temporal groups are 1 s apart. Padding (attention_mask 0) gets
    position 1, as in Qwen's code; it is masked out anyway. The bookkeeping runs on the host (a few
    thousand integers): one transfer in, one out, whatever device the ids are on.
    """
    batch, length = mm_token_type_ids.shape
    device = mm_token_type_ids.device
    mm_token_type_ids = mm_token_type_ids.cpu()
    attention_mask = attention_mask.cpu() if attention_mask is not None else None

    def merged(grids: torch.Tensor | None) -> list[tuple[int, int, int]]:
        rows = grids.tolist() if grids is not None else []
        return [(t, h // spatial_merge_size, w // spatial_merge_size) for t, h, w in rows]

    images = iter(merged(image_grid_thw))
    videos = merged(video_grid_thw)
    if second_per_grid_ts is None:
        seconds = [1.0] * len(videos)
    else:
        seconds = torch.as_tensor(second_per_grid_ts, dtype=torch.float32).reshape(-1).tolist()
        if len(seconds) != len(videos):
            raise ValueError(f"{len(seconds)} second_per_grid_ts for {len(videos)} videos")
    video_iter = iter(zip(videos, seconds))

    out = torch.ones(3, batch, length, dtype=torch.long)
    for b in range(batch):
        types = mm_token_type_ids[b]
        valid = attention_mask[b].bool() if attention_mask is not None else None
        if valid is not None:
            types = types[valid]
        positions = sequence_positions(types, _interleave(types, images, video_iter), tokens_per_second)
        if valid is None:
            out[:, b] = positions
        else:
            out[:, b, valid] = positions
    return out.to(device)


def _interleave(types: torch.Tensor, images: Iterator, videos: Iterator) -> Iterator[tuple[Sequence[int], float]]:
    """Yield (merged grid, seconds per group) for each vision segment of `types` in order."""
    kinds = types[types != TEXT].tolist()
    i = 0
    while i < len(kinds):
        if kinds[i] == IMAGE:
            try:
                grid = next(images)
            except StopIteration:
                raise ValueError("the sequence holds more image tokens than image grids") from None
            yield grid, 0.0
        else:
            try:
                grid, seconds = next(videos)
            except StopIteration:
                raise ValueError("the sequence holds more video tokens than video grids") from None
            yield grid, seconds
        i += grid[0] * grid[1] * grid[2]


# ------------------------------------------------------------------------------------------------
# Qwen3-VL


def qwen3_vl_positions(
    mm_token_type_ids: torch.Tensor,
    spatial_merge_size: int,
    video_grid_thw: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen3-VL's M-RoPE positions (3, B, L).

    Qwen3-VL has no time axis in M-RoPE: the processor writes each temporal group of a video as its
    own block (`<t seconds><|vision_start|>` tokens `<|vision_end|>`), and each block is a vision
    segment of grid (1, H', W'): the group starting at `s` puts its token (row, col) at
    (s, s + row, s + col), and whatever follows (the next timestamp's text, the question) starts at
    the largest position so far + 1 = s + max(H', W'). Text is 1-D as for Qwen2.5-VL. This is
    Qwen2.5-VL's rule (`qwen2_5_vl_positions`) with every video split into T' segments of one group
    and no time interval, so it is computed by that function. The interleaving of the
    (time, row, column) frequencies (`mrope_interleaved`) is in the rotary embedding, not in the
    positions. docs/qwen3_vl.md has a worked example.
    """
    groups = seconds = None
    if video_grid_thw is not None:
        grids = torch.as_tensor(video_grid_thw).reshape(-1, 3).cpu()
        groups = grids.repeat_interleave(grids[:, 0], dim=0)
        groups[:, 0] = 1
        seconds = [0.0] * groups.shape[0]
    return qwen2_5_vl_positions(mm_token_type_ids, spatial_merge_size, tokens_per_second=0.0,
                                video_grid_thw=groups, second_per_grid_ts=seconds, image_grid_thw=image_grid_thw,
                                attention_mask=attention_mask)
