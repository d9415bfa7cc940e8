"""`methods.output_count`: a method's count as a pure function of T, N, the ratio and its config, which a
server sizes its prompt with before the encoder runs (vLLM: docs/vllm.md, "Exact counts"). Checked
against every method's output over its options (every bool and every choice its config lists), on
shapes that include the short clips where the authors' OTT-Vid caps bind (2 groups x 16 tokens)."""

from __future__ import annotations

import itertools
import re
from dataclasses import fields

import pytest
import torch

from ottvid_cli.compression import methods

SHAPES = [(2, 16), (3, 9), (4, 16), (5, 12), (1, 20)]
RATIOS = [0.1, 0.25, 0.5]
RUNNABLE = [name for name in methods.names() if name != "none"]


def _choices(name: str, field: str) -> list[str]:
    """The values a string option takes, read from the config's own refusal ("... one of a, b, got ...")."""
    try:
        methods.make_config(name, 0.5, **{field: "__probe__"})
    except ValueError as exc:
        found = re.search(r"one of ([^;]+?), got", str(exc))
        if found:
            return [v.strip() for v in found.group(1).split(",")]
    return []


def _variants(name: str) -> list[dict]:
    """Each bool and each listed choice of the method's options, one at a time (the defaults otherwise),
    and every pair of bools (exact with bug_compatible, ...); the configs refuse what they do not take."""
    default = methods.get(name).config()
    single: list[dict] = [{}]
    bools = []
    for f in fields(default):
        value = getattr(default, f.name)
        if isinstance(value, bool):
            single.append({f.name: not value})
            bools.append(f.name)
        elif isinstance(value, str):
            single += [{f.name: v} for v in _choices(name, f.name) if v != value]
    pairs = [{a: not getattr(default, a), b: not getattr(default, b)} for a, b in itertools.combinations(bools, 2)]
    return single + pairs


def _inputs(groups: int, tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, tokens, 8, generator=g)
    features = base + 0.3 * torch.randn(groups, tokens, 8, generator=g)  # frames alike, as video frames are
    saliency = torch.softmax(torch.randn(groups, tokens, generator=g), -1)
    side = int(tokens ** 0.5)
    grid = (side, side) if side * side == tokens else (1, tokens)
    return features, saliency, grid


@pytest.mark.parametrize("name", RUNNABLE)
def test_output_count_is_what_the_method_returns(name):
    checked = 0
    for options in _variants(name):
        for ratio in RATIOS:
            try:
                config = methods.make_config(name, ratio, **options)
            except ValueError:
                continue  # a combination the config refuses
            for groups, tokens in SHAPES:
                count = methods.output_count(name, config, groups, tokens)
                if count is None:
                    continue  # content-dependent: a server refuses it (tests/test_vllm_pruning.py)
                for seed in range(2):
                    features, saliency, grid = _inputs(groups, tokens, seed)
                    try:
                        out = methods.get(name).fn(features, saliency, grid, config)
                    except ValueError:
                        continue  # a shape this path does not take (it says so before compressing)
                    assert out.index.numel() == count, (name, options, ratio, groups, tokens)
                    checked += 1
    assert checked > 0


def test_counts_by_hand():
    ottvid = methods.make_config("ottvid", 0.1)
    assert methods.output_count("ottvid", ottvid, 16, 256) == methods.target_count(0.1, 16, 256) == 410
    official = methods.make_config("ottvid", 0.1, budget_cap="K-1", k_rounding="floor")
    # 2 groups x 16 tokens at 10%: M = 3, K = floor(16 x 0.1^0.7) = 3, the K - 1 cap lets 2 go: 4 remain
    assert methods.output_count("ottvid", official, 2, 16) == 4
    assert methods.output_count("fastvid", methods.make_config("fastvid", 0.1, exact=False), 4, 16) is None
    evs = methods.make_config("evs", 0.1, exact=False)
    assert methods.output_count("evs", evs, 4, 16) == 16  # vLLM's: at least one whole group
    assert methods.output_count("none", methods.make_config("none", 1.0), 3, 5) == 15
