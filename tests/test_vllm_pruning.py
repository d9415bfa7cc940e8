"""The vLLM plugin's torch-only parts, in the test environment (no vLLM): the settings read from
hf_overrides, the positions attached to compressed video tokens, and their encoding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ottvid_cli.compression import OTTVidConfig, methods
from ottvid_cli.integrations.vllm import pruning, qwen3_layout, settings


def config(**overrides):
    return SimpleNamespace(**overrides)


# -- settings -------------------------------------------------------------------------------------

def test_no_ottvid_keys_is_stock_vllm():
    assert settings.read(config(), 0.9) is None
    assert settings.read(config(ottvid_method=None), 0.9) is None


def test_the_issue_spelling_keeps_one_minus_q():
    chosen = settings.read(config(ottvid_method="ottvid"), 0.9)
    assert chosen.method == "ottvid" and chosen.ratio == pytest.approx(0.1)
    assert isinstance(chosen.config, OTTVidConfig) and chosen.config.ratio == pytest.approx(0.1)


def test_q_zero_or_unset_is_stock_but_settings_are_still_checked():
    assert settings.read(config(ottvid_method="ottvid"), 0.0) is None
    assert settings.read(config(ottvid_method="ottvid"), None) is None
    with pytest.raises(settings.SettingsError):
        settings.read(config(ottvid_method="nope"), 0.0)


def test_unknown_method_is_one_line_naming_the_known_ones():
    with pytest.raises(settings.SettingsError) as err:
        settings.read(config(ottvid_method="nope"), 0.9)
    message = str(err.value)
    assert "\n" not in message and "'nope'" in message
    for name in methods.names():
        assert (name in message) == (name != "none")


@pytest.mark.parametrize("args", [{"max_iter": 50, "sinkhorn_stop": "fixed"}, ["max_iter=50", "sinkhorn_stop=fixed"]])
def test_method_args_as_an_object_or_key_value_strings(args):
    chosen = settings.read(config(ottvid_method="ottvid", ottvid_method_args=args), 0.75)
    assert chosen.config.max_iter == 50 and chosen.config.sinkhorn_stop == "fixed"
    assert chosen.ratio == pytest.approx(0.25)


def test_another_methods_options():
    chosen = settings.read(config(ottvid_method="fastvid", ottvid_method_args={"exact": True}), 0.9)
    assert chosen.method == "fastvid" and chosen.config.exact is True


@pytest.mark.parametrize("overrides, words", [
    ({"ottvid_method": "ottvid", "ottvid_method_args": {"no_such": 1}}, ["unknown option 'no_such'", "max_iter"]),
    ({"ottvid_method": "ottvid", "ottvid_method_args": {"max_iter": "many"}}, ["max_iter", "integer"]),
    ({"ottvid_method": "ottvid", "ottvid_method_args": 5}, ["ottvid_method_args must be"]),
    ({"ottvid_method_args": {"max_iter": 5}}, ["without ottvid_method"]),
    ({"ottvid_method": "ottvid", "ottvid_preset": "fast"}, ["paper or official"]),
    ({"ottvid_method": 3}, ["not a known method"]),
])
def test_bad_settings_are_one_line(overrides, words):
    with pytest.raises(settings.SettingsError) as err:
        settings.read(config(**overrides), 0.9)
    assert "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)
    assert "--method-arg" not in str(err.value)


def test_official_preset():
    chosen = settings.read(config(ottvid_method="ottvid", ottvid_preset="official"), 0.9)
    assert chosen.config == OTTVidConfig.official(ratio=chosen.ratio)


# -- positions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_positions_survive_any_float_dtype(dtype):
    values = torch.tensor([[0, 1, 255, 256, 257, 65535, 65536, 2**24 - 1]] * 4)
    channels = pruning.encode_positions(values, dtype)
    assert channels.dtype == dtype and channels.shape == (8, 4 * pruning.DIGITS)
    assert torch.equal(pruning.decode_positions(channels), values)
    if dtype != torch.float32:  # what a plain cast to the model's dtype loses (vLLM's EVS channels)
        assert values.to(dtype).long().tolist() != values.tolist()


def test_positions_past_the_encoding_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        pruning.encode_positions(torch.tensor([[2**24]] * 4), torch.float32)


@pytest.mark.parametrize(("q", "kept", "tokens", "want"), [
    (0.9, 0.1, 75, 8),  # 1 - 0.9 in floating point is 0.0999...: round(7.4999...) kept 7
    (0.7, 0.3, 10, 3),  # 1 - 0.7 = 0.30000000000000004
    (0.75, 0.25, 64, 16),
    (0.99, 0.01, 250, 2),  # round(2.5) = 2: halves go to the even neighbour, as everywhere in ottvid
])
def test_the_kept_share_is_exact_from_q_as_written(q, kept, tokens, want):
    chosen = settings.read(config(ottvid_method="ottvid"), q)
    assert chosen.ratio == kept and chosen.config.ratio == kept
    assert pruning.retained(chosen.method, chosen.config, 1, tokens) == want == methods.target_count(kept, 1, tokens)


def _retained(ratio: float, groups: int, tokens: int, method: str = "ottvid", **options) -> int:
    return pruning.retained(method, methods.make_config(method, ratio, **options), groups, tokens)


def test_retained_is_round_not_vllms_floor():
    assert _retained(0.25, 4, 12) == 12
    assert _retained(0.1, 50, 2) == 10  # vLLM's EVS: max(2, int(100 * 0.1)) = 9 (its float arithmetic)
    assert _retained(0.001, 2, 4) == 1


def test_retained_is_the_methods_own_count_rule():
    """The settings that ended the engine: the authors' preset's K - 1 cap keeps 4 of 2 x 16 at
    10% (M = 3); the placeholders are those 4, and the method returns them."""
    official = methods.make_config("ottvid", 0.1, budget_cap="K-1", k_rounding="floor")
    assert pruning.retained("ottvid", official, 2, 16) == 4
    embeds, sal = _video(2, 4, 4, d=8, seed=3)
    assert pruning.run_method(embeds, (2, 4, 4), sal, "ottvid", official).index.numel() == 4
    with pytest.raises(ValueError, match="depends on the video"):
        pruning.retained("fastvid", methods.make_config("fastvid", 0.1, exact=False), 2, 16)


@pytest.mark.parametrize("overrides", [
    {"ottvid_method": "fastvid", "ottvid_method_args": {"exact": False}},
    {"ottvid_method": "divprune", "ottvid_method_args": ["exact=false"]},
    {"ottvid_method": "flashvid", "ottvid_method_args": {"exact": False}},
])
def test_a_count_that_depends_on_the_video_is_refused_at_start_up(overrides):
    with pytest.raises(settings.SettingsError, match="depends on the video") as caught:
        settings.read(config(**overrides), 0.9)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("overrides", [
    {"ottvid_method": "ottvid", "ottvid_preset": "official"},
    {"ottvid_method": "ottvid", "ottvid_method_args": {"budget_cap": "K-1"}},
    {"ottvid_method": "evs", "ottvid_method_args": {"exact": False}},
])
def test_counts_of_their_own_that_are_pure_are_served(overrides):
    chosen = settings.read(config(**overrides), 0.9)
    for groups, tokens in ((2, 16), (4, 16), (16, 256)):
        count = pruning.retained(chosen.method, chosen.config, groups, tokens)
        assert count == methods.output_count(chosen.method, chosen.config, groups, tokens) >= 1


def _video(t: int, h: int, w: int, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t * h * w, d, generator=g), torch.rand(t * h * w, generator=g)


def test_kept_tokens_carry_their_roots_positions_by_hand():
    # 3 groups of 2 x 2 merged tokens, 2 s a group, 25 tokens a second: times 0, 50, 100 (docs/positions.md)
    embeds, sal = _video(3, 2, 2)
    cfg = methods.make_config("topk", 0.5)
    rows, out = pruning.compress_video(embeds, (3, 2, 2), sal, 2.0, 25, "topk", cfg)
    assert rows.shape == (6, 8 + pruning.CHANNELS)
    assert torch.equal(rows[:, :8], out.features)
    positions = pruning.decode_positions(rows[:, 8:])
    table = {i: (t, r, c) for i, (t, r, c) in enumerate(
        [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (50, 0, 0), (50, 0, 1), (50, 1, 0), (50, 1, 1),
         (100, 0, 0), (100, 0, 1), (100, 1, 0), (100, 1, 1)])}
    for j, index in enumerate(out.index.tolist()):
        assert tuple(positions[:3, j].tolist()) == table[index]
    # the text after the video: the whole video's largest position + 1, whichever tokens were kept
    assert positions[3].tolist() == [101] * 6
    # each row's index in the item, no lead (the item is its run of placeholders), the item's length
    assert positions[4].tolist() == list(range(6)) and positions[5].tolist() == [0] * 6
    assert positions[6].tolist() == [6] * 6


def test_the_next_text_follows_the_whole_video_even_when_its_last_group_is_dropped():
    embeds, _ = _video(3, 2, 2)
    # EVS ranks the first group first (vLLM's 255): a third of the tokens is that group alone
    rows, out = pruning.compress_video(embeds, (3, 2, 2), None, 2.0, 25, "evs", methods.make_config("evs", 1 / 3))
    positions = pruning.decode_positions(rows[:, 8:])
    assert out.index.tolist() == [0, 1, 2, 3] and positions[0].tolist() == [0] * 4
    assert positions[3].tolist() == [101] * 4


def test_time_in_float32_as_trained():
    # 32 frames over 33.6 s: 2.1 s a group; group 15 at 15 x 2.1 x 2 = 63 exactly, 62 in float32
    embeds, sal = _video(16, 1, 1)
    rows, _ = pruning.compress_video(embeds, (16, 1, 1), sal, 2.1, 2, "topk", methods.make_config("topk", 1.0))
    positions = pruning.decode_positions(rows[:, 8:])
    assert positions[0, 15].item() == 62 and positions[3, 0].item() == 63


def test_ottvid_merged_tokens_sit_at_their_root():
    embeds, sal = _video(4, 3, 4, d=16, seed=1)
    cfg = OTTVidConfig(ratio=0.25)
    rows, out = pruning.compress_video(embeds, (4, 3, 4), sal, 1.0, 2, "ottvid", cfg)
    assert rows.shape[0] == _retained(0.25, 4, 12) == out.index.numel()
    positions = pruning.decode_positions(rows[:, 16:])
    t, rest = out.index // 12, out.index % 12
    assert positions[0].tolist() == (t * 2).tolist()
    assert positions[1].tolist() == (rest // 4).tolist() and positions[2].tolist() == (rest % 4).tolist()


def test_a_method_with_a_pure_count_of_its_own_fills_that_many_placeholders():
    embeds, sal = _video(4, 2, 2)
    cfg = methods.make_config("evs", 0.1, exact=False)  # vLLM's own count: at least the first group (4, not 2)
    rows, out = pruning.compress_video(embeds, (4, 2, 2), sal, 1.0, 2, "evs", cfg)
    assert rows.shape[0] == out.index.numel() == pruning.retained("evs", cfg, 4, 4) == 4


def test_image_positions_end_at_the_larger_side():
    positions = pruning.decode_positions(pruning.image_channels((1, 2, 5), torch.bfloat16, torch.device("cpu")))
    assert positions[0].tolist() == [0] * 10 and positions[3].tolist() == [5] * 10
    assert positions[1].tolist() == [0] * 5 + [1] * 5 and positions[2].tolist() == list(range(5)) * 2


# -- Qwen3-VL: the layout of a compressed video, and its positions in the request ---------------------

TS, VS, VE, VID, IMG, TXT = 90, 91, 92, 93, 94, 95  # made-up token ids: a timestamp's text, markers, video, image


def qwen3_item(groups: int, tokens: int, stamp: int = 2) -> torch.Tensor:
    """An uncompressed Qwen3-VL video item: per group `stamp` timestamp tokens, <vs>, `tokens` video, <ve>."""
    return torch.tensor(([TS] * stamp + [VS] + [VID] * tokens + [VE]) * groups)


def test_qwen3_lumped_placeholder_resized_to_our_count():
    ids = [TXT, TS, TS, VS, VID, VID, VID, VE, TS, VS, VE, TXT, TS, VS, VID, VE]
    assert qwen3_layout.resize_video_runs(ids, VID, [1, 4]) == [
        TXT, TS, TS, VS, VID, VE, TS, VS, VE, TXT, TS, VS, VID, VID, VID, VID, VE]
    with pytest.raises(ValueError, match="more runs of video placeholders than its 1 videos"):
        qwen3_layout.resize_video_runs(ids, VID, [1])


def test_qwen3_layout_by_hand_with_an_emptied_group():
    """3 groups of a 2 x 2 grid, each `ts ts <vs> v v v v <ve>` (8 tokens); kept: tokens 1 and 3 of group 0,
    none of group 1, token 0 of group 2. Text keeps its uncompressed positions, each kept token its own:
    group g's block starts at s = 6 g + 3 (2 timestamp tokens, <vs>, a block 2 wide, <ve> before it) with
    (s, s + row, s + col), its <ve> at s + max(2, 2), emptied or not; what follows the item at 18."""
    ids, values = qwen3_layout.video_layout(qwen3_item(3, 4), VID, VS, (3, 2, 2), torch.tensor([1, 3, 8]))
    assert ids.tolist() == [TS, TS, VS, VID, VID, VE, TS, TS, VS, VE, TS, TS, VS, VID, VE]
    t, h, w, following, j, lead, length = values.tolist()
    assert t == [0, 1, 2, 3, 3, 5, 6, 7, 8, 11, 12, 13, 14, 15, 17]
    assert h == [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 17]
    assert w == [0, 1, 2, 4, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 17]
    assert following == [18] * 15 and j == list(range(15)) and lead == [3] * 15 and length == [15] * 15


def test_qwen3_positions_in_the_request_by_hand():
    """Prompt: 2 text tokens, <vs> (the template's), the lumped item, <ve>, 2 text tokens. The item starts at
    base = 3; what follows it at base + 18 = 21 onward; the generated tokens continue from there (delta)."""
    ids, values = qwen3_layout.video_layout(qwen3_item(3, 4), VID, VS, (3, 2, 2), torch.tensor([1, 3, 8]))
    lumped = [TS, TS, VS, VID, VID, VID, VE, TS, TS, VS, VE, TS, TS, VS, VE]  # vLLM's: all 3 in group 0's block
    prompt = torch.tensor([TXT, TXT, VS] + lumped + [VE, TXT, TXT])
    n = prompt.numel()
    stale = torch.arange(n).expand(3, n)  # whatever vLLM computed for the unpruned prompt
    positions, delta = pruning.place(prompt, [values], stale, 0, VID, IMG)
    assert positions[:, :3].tolist() == [[0, 1, 2]] * 3
    assert positions[:, 3:18].tolist() == (values[:3] + 3).tolist()
    assert positions[:, 18:].tolist() == [[21, 22, 23]] * 3
    assert delta == 24 - n
    # vLLM's first positions of a lumped run shorter than a group run past the prompt: the same, cut at n
    longer, longer_delta = pruning.place(prompt, [values], torch.arange(n + 5).expand(3, n + 5), 0, VID, IMG)
    assert torch.equal(longer[:, :n], positions) and longer_delta == delta


def test_qwen3_positions_by_prefill_chunk_equal_one_pass():
    """vLLM's chunked prefill hands the item's rows over in pieces (a piece may begin inside the item);
    placed chunk by chunk, with a second video and an image after it, the positions equal one pass."""
    first_ids, first = qwen3_layout.video_layout(qwen3_item(3, 4), VID, VS, (3, 2, 2), torch.tensor([1, 3, 8]))
    second_ids, second = qwen3_layout.video_layout(qwen3_item(2, 4, stamp=3), VID, VS, (2, 2, 2),
                                                   torch.tensor([5, 6]))
    image = pruning.image_values((1, 2, 3))
    lumped_one = [TS, TS, VS, VID, VID, VID, VE, TS, TS, VS, VE, TS, TS, VS, VE]
    lumped_two = [TS, TS, TS, VS, VID, VID, VE, TS, TS, TS, VS, VE]
    prompt = torch.tensor([TXT, VS] + lumped_one + [VE, TXT] + [VS] + lumped_two + [VE, VS] + [IMG] * 6
                          + [VE, TXT, TXT])
    n = prompt.numel()
    stale = torch.arange(n).expand(3, n)
    whole, whole_delta = pruning.place(prompt, [first, second, image], stale, 0, VID, IMG)
    # the chunks: [0, 10) cuts the first video after 8 of its rows; [10, 30) holds its rest and 10 rows of
    # the second; [30, n) the second's last 2 rows and the image
    positions = stale
    positions, _ = pruning.place(prompt, [first[:, :8]], positions, 0, VID, IMG)
    positions, _ = pruning.place(prompt, [first[:, 8:], second[:, :10]], positions, 10, VID, IMG)
    positions, delta = pruning.place(prompt, [second[:, 10:], image], positions, 30, VID, IMG)
    assert torch.equal(positions, whole) and delta == whole_delta
    # the image: (0, row, col) one past the <vs> before it, what follows at + max(2, 3)
    at = prompt.tolist().index(IMG)
    s = int(whole[0, at - 1]) + 1
    assert whole[:, at:at + 6].tolist() == [[s] * 6, [s, s, s, s + 1, s + 1, s + 1], [s, s + 1, s + 2] * 2]
    assert whole[:, at + 6].tolist() == [s + 3] * 3
    assert second_ids.numel() == len(lumped_two) and first_ids.numel() == len(lumped_one)


def test_qwen3_values_survive_bfloat16():
    _, values = qwen3_layout.video_layout(qwen3_item(300, 4), VID, VS, (300, 2, 2), torch.arange(0, 1200, 10))
    assert int(values.max()) > 1000  # past what bfloat16 holds exactly (256)
    encoded = pruning.encode_positions(values, torch.bfloat16)
    assert encoded.shape == (values.shape[1], pruning.CHANNELS)
    assert torch.equal(pruning.decode_positions(encoded), values)


def test_first_positions_put_the_text_after_each_item_where_the_trained_rule_does():
    """3 text tokens; a compressed video of 5 placeholders whose uncompressed grid ends at +6 (following 7);
    2 text tokens; a 2 x 2 image (exact rows, following 2); 1 text token. The video's rows hold stand-ins
    (first + min(i, 6)) until the model places them; everything else is final."""
    image = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]])
    positions, delta = pruning.first_positions(15, [(10, 4, 2, image), (3, 5, 7, None)])
    assert positions[:, :3].tolist() == [[0, 1, 2]] * 3
    assert positions[:, 3:8].tolist() == [[3, 4, 5, 6, 7]] * 3
    assert positions[:, 8:10].tolist() == [[10, 11]] * 3  # 3 + 7
    assert positions[:, 10:14].tolist() == (image + 12).tolist()
    assert positions[:, 14].tolist() == [14] * 3  # 12 + 2
    assert delta == 15 - 15
    stand_in, _ = pruning.first_positions(6, [(0, 6, 3, None)])  # more placeholders than the grid's extent
    assert stand_in[0].tolist() == [0, 1, 2, 2, 2, 2]


def test_an_image_then_a_qwen2_5_video_in_one_chunk_by_hand():
    """Qwen2.5-VL: text, <vs> + a 2 x 2 image + <ve>, text, <vs> + 3 kept video tokens + <ve>, text, all in one
    prefill chunk. The image at (s, s + row, s + col), what follows at s + 2; the video's tokens at its
    start + their roots' positions, what follows at its start + next (vLLM's own function placed the video
    over the image: it looks for the first <|vision_start|> again)."""
    video = pruning.item_values(torch.tensor([[0, 2, 4], [0, 1, 0], [1, 1, 0]]), 7)
    prompt = torch.tensor([TXT, VS, IMG, IMG, IMG, IMG, VE, TXT, VS, VID, VID, VID, VE, TXT])
    n = prompt.numel()
    positions, delta = pruning.place(prompt, [pruning.image_values((1, 2, 2)), video],
                                     torch.arange(n + 9).expand(3, n + 9), 0, VID, IMG)
    assert positions[:, :2].tolist() == [[0, 1]] * 3
    assert positions[:, 2:6].T.tolist() == [[2, 2, 2], [2, 2, 3], [2, 3, 2], [2, 3, 3]]
    assert positions[:, 6:9].tolist() == [[4, 5, 6]] * 3
    assert positions[:, 9:12].tolist() == [[7, 9, 11], [7, 8, 7], [8, 8, 7]]
    assert positions[:, 12:n].tolist() == [[14, 15]] * 3 and delta == 16 - n
