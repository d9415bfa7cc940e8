"""The vLLM plugin's torch-only parts, in the test environment (no vLLM): the settings read from
hf_overrides, the positions attached to compressed video tokens, and their encoding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ottvid_cli.compression import OTTVidConfig, methods
from ottvid_cli.integrations.vllm import pruning, settings


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
    assert channels.dtype == dtype and channels.shape == (8, pruning.POSITION_CHANNELS)
    assert torch.equal(pruning.decode_positions(channels), values)
    if dtype != torch.float32:  # what a plain cast to the model's dtype loses (vLLM's EVS channels)
        assert values.to(dtype).long().tolist() != values.tolist()


def test_positions_past_the_encoding_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        pruning.encode_positions(torch.tensor([[2**24]] * 4), torch.float32)


def test_retained_is_round_not_vllms_floor():
    assert pruning.retained(0.25, 4, 12) == 12
    assert pruning.retained(0.1, 50, 2) == 10  # vLLM's EVS: max(2, int(100 * 0.1)) = 9 (its float arithmetic)
    assert pruning.retained(0.001, 2, 4) == 1


def _video(t: int, h: int, w: int, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t * h * w, d, generator=g), torch.rand(t * h * w, generator=g)


def test_kept_tokens_carry_their_roots_positions_by_hand():
    # 3 groups of 2 x 2 merged tokens, 2 s a group, 25 tokens a second: times 0, 50, 100 (docs/positions.md)
    embeds, sal = _video(3, 2, 2)
    cfg = methods.make_config("topk", 0.5)
    rows, out = pruning.compress_video(embeds, (3, 2, 2), sal, 2.0, 25, "topk", cfg)
    assert rows.shape == (6, 8 + pruning.POSITION_CHANNELS)
    assert torch.equal(rows[:, :8], out.features)
    positions = pruning.decode_positions(rows[:, 8:])
    table = {i: (t, r, c) for i, (t, r, c) in enumerate(
        [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (50, 0, 0), (50, 0, 1), (50, 1, 0), (50, 1, 1),
         (100, 0, 0), (100, 0, 1), (100, 1, 0), (100, 1, 1)])}
    for j, index in enumerate(out.index.tolist()):
        assert tuple(positions[:3, j].tolist()) == table[index]
    # the text after the video: the whole video's largest position + 1, whichever tokens were kept
    assert positions[3].tolist() == [101] * 6


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
    assert rows.shape[0] == pruning.retained(0.25, 4, 12) == out.index.numel()
    positions = pruning.decode_positions(rows[:, 16:])
    t, rest = out.index // 12, out.index % 12
    assert positions[0].tolist() == (t * 2).tolist()
    assert positions[1].tolist() == (rest // 4).tolist() and positions[2].tolist() == (rest % 4).tolist()


def test_a_method_that_misses_the_count_is_refused():
    embeds, sal = _video(4, 2, 2)
    cfg = methods.make_config("evs", 0.1, exact=False)  # vLLM's own count: at least the first group (4, not 2)
    with pytest.raises(ValueError, match="placeholders"):
        pruning.compress_video(embeds, (4, 2, 2), sal, 1.0, 2, "evs", cfg)


def test_image_positions_end_at_the_larger_side():
    positions = pruning.decode_positions(pruning.image_channels((1, 2, 5), torch.bfloat16, torch.device("cpu")))
    assert positions[0].tolist() == [0] * 10 and positions[3].tolist() == [5] * 10
    assert positions[1].tolist() == [0] * 5 + [1] * 5 and positions[2].tolist() == list(range(5)) * 2
