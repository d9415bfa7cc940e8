"""The vLLM plugin's Qwen3-VL, dense and MoE, end to end in vLLM's CPU build (tests/vllm_env.py).

Parity with ottvid's own Qwen3-VL pipeline on the same checkpoint and the same frames (given as frames) at
ratio 0.25 (q = 0.75), every registered method, one engine per model: vLLM's prompt holds the video's
round((1 - q) V) placeholders lumped in the first group's block; what the LLM receives is ottvid_cli's
sequence token for token (each group's `<t seconds><|vision_start|>` + the tokens kept from it +
`<|vision_end|>`), the same kept tokens at the same positions, DeepStack merged as the main features, and
the first generated token's log-probabilities within 1e-3 (float32). Positions are also checked by hand.
OTTVID_SKIP_VLLM_ENV=1 skips them on purpose.
"""

from __future__ import annotations

import numpy as np
import pytest

from ottvid_cli.compression import methods
from vllm_parity import ours_at, prompt_text, run_job

pytestmark = pytest.mark.slow

FRAMES, SIDE, FPS = 8, 128, 2.0  # 4 groups of 4 x 4 merged tokens (patch 16, merge 2): V = 64
TOKENS = (SIDE // 32) ** 2
V = FRAMES // 2 * TOKENS
RUNNABLE = [name for name in methods.names() if name != "none"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    frames = np.random.default_rng(3).integers(0, 256, size=(FRAMES, SIDE, SIDE, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("vllm_qwen3_clip") / "frames.npy"
    np.save(path, frames)
    return path


def _load(path):
    from ottvid_cli.backbones.qwen3_vl import Qwen3VL

    return Qwen3VL.load(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def dense(tiny_qwen3_vllm):
    return _load(tiny_qwen3_vllm)


@pytest.fixture(scope="module")
def moe(tiny_qwen3_moe_vllm):
    return _load(tiny_qwen3_moe_vllm)


def _every_method(vllm_env, model, backbone, clip, tmp_path_factory) -> dict[str, dict]:
    runs = run_job(vllm_env, tmp_path_factory.mktemp("vllm_qwen3_jobs"), model=str(model), q=0.75,
                   overrides={"ottvid_method": "ottvid"}, frames=str(clip), fps=FPS, prompt=prompt_text(backbone),
                   methods=RUNNABLE, logprobs=5)
    return {run["method"]: run for run in runs}


@pytest.fixture(scope="module")
def dense_runs(vllm_env, tiny_qwen3_vllm, dense, clip, tmp_path_factory):
    return _every_method(vllm_env, tiny_qwen3_vllm, dense, clip, tmp_path_factory)


@pytest.fixture(scope="module")
def moe_runs(vllm_env, tiny_qwen3_moe_vllm, moe, clip, tmp_path_factory):
    return _every_method(vllm_env, tiny_qwen3_moe_vllm, moe, clip, tmp_path_factory)


def _item(run: dict, backbone) -> tuple[int, list[int]]:
    """Where the video's placeholder starts in vLLM's prompt, and the item's tokens as the LLM received them."""
    (layout,) = run["layout"]
    config = backbone.model.config
    lead = layout.index(config.vision_start_token_id) + 1  # the first group's timestamp and its marker
    return run["prompt_token_ids"].index(config.video_token_id) - lead, layout


def _check_parity(run: dict, backbone, clip, method: str, model_class: str) -> None:
    mine = ours_at(backbone, clip, method, 0.25, fps=FPS)
    assert run["model_class"] == model_class
    assert run["pruning_flag"] and run["plugin_scope_enables"]
    ids, video = run["prompt_token_ids"], backbone.model.config.video_token_id
    # vLLM's prompt: round((1 - q) V) placeholders, all in the first group's block
    assert ids.count(video) == len(mine["kept"]) == round(0.25 * V) == 16
    assert len(ids) == len(mine["ids"])
    start, layout = _item(run, backbone)
    assert ids[start:].index(video) < ids[start:].index(backbone.model.config.vision_end_token_id)
    # what the LLM received is ottvid_cli's sequence token for token
    assert ids[:start] + layout + ids[start + len(layout):] == mine["ids"]
    assert run["kept"] == [mine["kept"]]
    assert [row[: len(ids)] for row in run["positions"]] == mine["positions"]
    assert len(run["logprobs"]) == 5
    for token, logprob in run["logprobs"].items():
        assert abs(logprob - mine["logprobs"][int(token)].item()) < 1e-3, token


@pytest.mark.parametrize("method", RUNNABLE)
def test_every_method_in_vllm_qwen3_vl_matches_ottvid_cli(dense_runs, dense, clip, method):
    _check_parity(dense_runs[method], dense, clip, method, "OTTVidQwen3VL")


@pytest.mark.parametrize("method", RUNNABLE)
def test_every_method_in_vllm_qwen3_vl_moe_matches_ottvid_cli(moe_runs, moe, clip, method):
    _check_parity(moe_runs[method], moe, clip, method, "OTTVidQwen3VLMoe")


def test_qwen3_positions_by_hand(dense_runs, dense):
    """Qwen3-VL's trained rule written out: text one position a token; each group's block starts one past
    its `<|vision_start|>` at s and puts token (row, col) at (s, s + row, s + col); its `<|vision_end|>`
    at s + max(H', W') = s + 4 whatever was kept (an emptied group too); the text after the video at
    the next position. Each kept token sits in the block of the group it came from."""
    config = dense.model.config
    for method in ("ottvid", "holitom", "evs"):
        run = dense_runs[method]
        start, layout = _item(run, dense)
        positions = np.array([row[: len(run["prompt_token_ids"])] for row in run["positions"]])
        (kept,) = run["kept"]
        flats = iter(kept)
        p, group, expected = int(positions[:, start - 1].max()) + 1, -1, []
        i = 0
        while i < len(layout):
            if layout[i] != config.vision_start_token_id:
                expected.append([p] * 3)
                p, i = p + 1, i + 1
                continue
            expected.append([p] * 3)
            s, group, i = p + 1, group + 1, i + 1
            while layout[i] == config.video_token_id:
                flat = next(flats)
                assert flat // TOKENS == group
                row, col = divmod(flat % TOKENS, 4)
                expected.append([s, s + row, s + col])
                i += 1
            p = s + 4
        assert next(flats, None) is None and group == FRAMES // 2 - 1
        assert positions[:, start:start + len(layout)].T.tolist() == expected, method
        assert positions[:, start + len(layout)].tolist() == [p] * 3
