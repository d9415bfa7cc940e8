"""Qwen3-VL's compressed videos as vLLM's pruned-media path carries them (docs/vllm.md, "Qwen3-VL").
Torch only: no vLLM import.

In Qwen3-VL a video is text and vision interleaved: for each temporal group `<t seconds>`,
`<|vision_start|>`, the group's tokens, `<|vision_end|>`. vLLM sizes the prompt before the encoder
runs, so its processor writes all of a video's placeholders in the first group's block (the "lumped"
placeholder: `[count] + [0] * (T' - 1)`); the model returns embeddings for the whole placeholder, laid
out as the video really is. Ours is ottvid_cli's layout exactly: the uncompressed item with the
video tokens the method dropped removed, every timestamp and marker kept (docs/qwen3_vl.md). Its rows
carry `pruning`'s values (text its uncompressed position, a kept or merged token its root's; `lead`
where the lumped run starts), which `pruning.place` puts in the request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...backbones.positions import sequence_positions
from . import pruning

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
    """A compressed video item: (its token ids (L',), its rows' values (pruning.VALUES, L') long).

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
    lead = int((item_ids == vision_start).nonzero()[0]) + 1  # the first group's timestamp and marker
    return item_ids[keep], pruning.item_values(full[:, keep], int(full.max()) + 1, lead)
