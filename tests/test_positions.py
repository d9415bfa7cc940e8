"""Qwen2.5-VL M-RoPE positions by the trained rule, against hand-computed values (never transformers')."""

import pytest
import torch

from ottvid_cli.backbones.positions import qwen2_5_vl_positions, vision_positions

T, I, V = 0, 1, 2  # text, image, video token types


def positions(types, merge=2, tps=2, **grids):
    return qwen2_5_vl_positions(torch.tensor([types]), merge, tps, **grids)[:, 0].tolist()


def test_issue_example_three_groups_of_2x2_at_interval_50():
    # 3 temporal patches of 2x2 merged tokens, 2 s per group, 25 tokens per second: interval 50.
    got = positions([V] * 12 + [T] * 3, tps=25, video_grid_thw=torch.tensor([[3, 4, 4]]), second_per_grid_ts=[2.0])
    assert got[0] == [0, 0, 0, 0, 50, 50, 50, 50, 100, 100, 100, 100, 101, 102, 103]
    assert got[1] == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 101, 102, 103]
    assert got[2] == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 101, 102, 103]


def test_text_before_the_video_shifts_every_axis():
    got = positions([T, T] + [V] * 4 + [T], tps=25, video_grid_thw=torch.tensor([[1, 4, 4]]), second_per_grid_ts=[2.0])
    assert got == [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]  # largest: 2 + 1


def test_text_after_the_video_is_the_largest_video_position_plus_one():
    # 4 groups of 2x3 merged tokens, 2 s per group, 2 tokens/s: times 0, 4, 8, 12 after 3 text tokens.
    # The largest video position is 3 + 12 = 15, so the question starts at 16 (transformers 5.23
    # would start it at 3 + max(2, 3) = 6, inside the video's time axis).
    got = positions([T] * 3 + [V] * 24 + [T] * 2, video_grid_thw=torch.tensor([[4, 4, 6]]), second_per_grid_ts=[2.0])
    assert got[0][3:27] == [3] * 6 + [7] * 6 + [11] * 6 + [15] * 6
    assert got[1][3:9] == [3, 3, 3, 4, 4, 4] and got[2][3:9] == [3, 4, 5, 3, 4, 5]
    assert [row[27:] for row in got] == [[16, 17]] * 3


def test_tall_grid_short_video_ends_at_the_largest_row():
    # one group of 4x2 merged tokens: the largest position is the last row, start + 3
    got = positions([V] * 8 + [T], video_grid_thw=torch.tensor([[1, 8, 4]]), second_per_grid_ts=[0.5])
    assert got[1][:8] == [0, 0, 1, 1, 2, 2, 3, 3] and got[0][:8] == [0] * 8
    assert [row[8] for row in got] == [4, 4, 4]


def test_fractional_intervals_are_floored():
    # 3.75 s per group at 2 tokens/s: 7.5 a group -> 0, 7, 15, 22
    got = positions([V] * 4 + [T], video_grid_thw=torch.tensor([[4, 2, 2]]), second_per_grid_ts=[3.75])
    assert got[0] == [0, 7, 15, 22, 23]


def test_time_axis_in_float32_like_the_training_code():
    # 32 frames over 33.6 s: 2.1 s per group. Exactly, group 15 sits at 15 * 2.1 * 2 = 63; in the
    # training code's float32 arithmetic ((t * 2.1f) * 2) it is 62.99999 -> 62.
    times = vision_positions(0, (16, 1, 1), 2 / (32 / 33.6), 2)[0].tolist()
    assert times[-1] == 62 and times[:6] == [0, 4, 8, 12, 16, 21]


def test_several_vision_segments_images_and_padding():
    # left padding, an image (no time axis) then text then a video, in a batch of two
    types = torch.tensor([
        [T, T, I, I, T, V, V, V, V, T],
        [T, T, T, I, I, T, V, V, V, V],  # no text after the video
    ])
    mask = torch.tensor([[0] + [1] * 9, [1] * 10])
    types[0, 1:] = torch.tensor([T, I, I, T, V, V, V, V, T])
    got = qwen2_5_vl_positions(types, 2, 2, image_grid_thw=torch.tensor([[1, 2, 4], [1, 2, 4]]),
                               video_grid_thw=torch.tensor([[2, 2, 4], [2, 2, 4]]), second_per_grid_ts=[1.0, 3.0],
                               attention_mask=mask)
    # row 0: text 0; image 1x2 at 1 -> (1,1),(1,1)/(1,2); text 3; video 2 groups of 1x2 at 4, 2 s/group
    assert got[:, 0, 1:].tolist() == [[0, 1, 1, 3, 4, 4, 6, 6, 7], [0, 1, 1, 3, 4, 4, 4, 4, 7],
                                      [0, 1, 2, 3, 4, 5, 4, 5, 7]]
    assert got[:, 0, 0].tolist() == [1, 1, 1]  # padding
    # row 1: text 0-2; image at 3; text 5; video at 6 with 3 s a group: times 6, 12
    assert got[:, 1].tolist() == [[0, 1, 2, 3, 3, 5, 6, 6, 12, 12], [0, 1, 2, 3, 3, 5, 6, 6, 6, 6],
                                  [0, 1, 2, 3, 4, 5, 6, 7, 6, 7]]


def test_back_to_back_videos_are_told_apart_by_their_sizes():
    got = positions([V] * 2 + [V] * 2 + [T], video_grid_thw=torch.tensor([[2, 2, 2], [1, 2, 4]]),
                    second_per_grid_ts=[1.0, 1.0])
    assert got[0] == [0, 2, 3, 3, 5]
    assert got[2] == [0, 0, 3, 4, 5]


@pytest.mark.parametrize("types, grids", [
    ([V] * 5, [[1, 4, 4]]),  # more tokens than the grid
    ([V] * 3, [[1, 4, 4]]),  # fewer
    ([V] * 4, []),
])
def test_inconsistent_grids_are_refused(types, grids):
    with pytest.raises(ValueError):
        positions(types, video_grid_thw=torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
                  second_per_grid_ts=[1.0] * len(grids))



def vllm_positions_after_pruning(before, grid, second_per_grid_t, tps, after, merge=2):
    """Qwen2.5-VL positions as vLLM recomputes them once video pruning is on, read from vLLM's
    `Qwen2_5_VLForConditionalGeneration._postprocess_video_embeds_evs` (qwen2_5_vl.py) and
    `compute_mrope_for_media` / `recompute_mrope_positions` (multimodal/evs.py): `before` text
    tokens, one video (every token listed; a kept one keeps its own), `after` text tokens. The
    seconds per group are cast to an integer before anything else; a video token sits at start +
    (int(t * tps * seconds), row, column); the text after the video runs from start + the merged width."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    step = tps * int(second_per_grid_t)
    s = before
    tokens = [(p,) * 3 for p in range(before)]
    tokens += [(s + int(g * step), s + r, s + c) for g in range(t) for r in range(h) for c in range(w)]
    tokens += [(s + w + i,) * 3 for i in range(after)]
    return [list(axis) for axis in zip(*tokens)]


def test_worked_example_of_vllms_positions_after_pruning():
    """docs/positions.md, "vLLM's positions after pruning": 2 text tokens, 4 groups of 2 x 2 merged
    tokens at 1.5 s a group and 2 tokens a second, 3 text tokens after."""
    ours = positions([T, T] + [V] * 16 + [T] * 3, video_grid_thw=torch.tensor([[4, 4, 4]]), second_per_grid_ts=[1.5])
    vllm = vllm_positions_after_pruning(2, (4, 4, 4), 1.5, 2, 3)
    assert ours[0][2::4][:4] == [2, 5, 8, 11] and vllm[0][2::4][:4] == [2, 4, 6, 8]  # each group's time
    assert [row[18:] for row in ours] == [[12, 13, 14]] * 3  # the trained rule: largest (11) + 1
    assert [row[18:] for row in vllm] == [[4, 5, 6]] * 3  # vLLM: start 2 + width 2, inside the video's times
    assert [row[:18] for row in ours[1:]] == [row[:18] for row in vllm[1:]]  # rows and columns agree
    # at 2 fps (1 s a group) the times agree and only the text after the video moves
    ours = positions([T, T] + [V] * 16 + [T] * 3, video_grid_thw=torch.tensor([[4, 4, 4]]), second_per_grid_ts=[1.0])
    vllm = vllm_positions_after_pruning(2, (4, 4, 4), 1.0, 2, 3)
    assert [row[:18] for row in ours] == [row[:18] for row in vllm]
    assert ours[0][18:] == [9, 10, 11] and vllm[0][18:] == [4, 5, 6]
