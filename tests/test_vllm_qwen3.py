"""The vLLM plugin's Qwen3-VL, dense and MoE, end to end in vLLM's CPU build (benchmarks/envs/vllm_env.py).

Parity with ottvid's own Qwen3-VL pipeline on the same checkpoint and the same frames (given as frames) at
ratio 0.25 (q = 0.75), every registered method, one engine per model: vLLM's prompt holds the video's
round((1 - q) V) placeholders lumped in the first group's block; what the LLM receives is ottvid_cli's
sequence token for token (each group's `<t seconds><|vision_start|>` + the tokens kept from it +
`<|vision_end|>`), the same kept tokens at the same positions, DeepStack merged as the main features, and
the first generated token's log-probabilities within 1e-3 (float32). Positions are also checked by hand,
and vLLM's own OpenAI server with docs/vllm.md's spellings answers the official client with the exact count.
OTTVID_SKIP_VLLM_ENV=1 skips them on purpose.
"""

from __future__ import annotations

import numpy as np
import pytest

from ottvid_cli.compression import methods
from tests.support.vllm_parity import (QUESTION, RUNNERS, check_image_before_video, check_prefix_cache, check_runner,
                                       ours_at, prompt_text, run_jobs, write_clip)

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


def _every_method(model, backbone, clip, folder, image: bool = False) -> dict:
    """A job at q = 0.75, every method in turn on the clip; with `image`, one more request: an image before
    the video (`image+video`)."""
    extra = {}
    if image:
        np.save(folder / "image.npy", np.random.default_rng(4).integers(0, 256, size=(64, 64, 3), dtype=np.uint8))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "video"},
                                                 {"type": "text", "text": QUESTION}]}]
        extra = {"image": str(folder / "image.npy"), "image_prompt": backbone.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)}
    return dict(model=str(model), q=0.75, overrides={"ottvid_method": "ottvid"}, frames=str(clip), fps=FPS,
                prompt=prompt_text(backbone), methods=RUNNABLE, logprobs=5, **extra)


@pytest.fixture(scope="module", params=RUNNERS)
def both_runs(request, vllm_env, tiny_qwen3_vllm, tiny_qwen3_moe_vllm, dense, moe, clip, tmp_path_factory):
    """The dense engine (with the image request), then the MoE engine: each method's run; under Model
    Runner V1 and V2 (docs/vllm.md, "Model Runner V2")."""
    folder = tmp_path_factory.mktemp("vllm_qwen3_jobs")
    dense_job = _every_method(tiny_qwen3_vllm, dense, clip, folder, image=True)
    jobs = [{**job, "runner": request.param} for job in (dense_job, _every_method(tiny_qwen3_moe_vllm, moe, clip, folder))]
    results = run_jobs(vllm_env, folder, *jobs)
    return [{"runner": request.param, **{run["method"]: run for run in runs}} for runs in results]


@pytest.fixture(scope="module")
def dense_runs(both_runs):
    return both_runs[0]


@pytest.fixture(scope="module")
def moe_runs(both_runs):
    return both_runs[1]


def _item(run: dict, backbone) -> tuple[int, list[int]]:
    """Where the video's placeholder starts in vLLM's prompt, and the item's tokens as the LLM received them."""
    (layout,) = run["layout"]
    config = backbone.model.config
    lead = layout.index(config.vision_start_token_id) + 1  # the first group's timestamp and its marker
    return run["prompt_token_ids"].index(config.video_token_id) - lead, layout


def _check_parity(run: dict, backbone, clip, method: str, model_class: str, runner: str) -> None:
    mine = ours_at(backbone, clip, method, 0.25, fps=FPS)
    assert run["model_class"] == model_class
    check_runner(run, runner)
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
    _check_parity(dense_runs[method], dense, clip, method, "OTTVidQwen3VL", dense_runs["runner"])


@pytest.mark.parametrize("method", RUNNABLE)
def test_every_method_in_vllm_qwen3_vl_moe_matches_ottvid_cli(moe_runs, moe, clip, method):
    _check_parity(moe_runs[method], moe, clip, method, "OTTVidQwen3VLMoe", moe_runs["runner"])


def _by_hand(layout: list[int], kept: list[int], p: int, config) -> tuple[list[list[int]], int]:
    """Qwen3-VL's trained rule written out for an item laid out as `layout` starting at position p: text one
    position a token; each group's block starts one past its `<|vision_start|>` at s and puts token (row,
    col) at (s, s + row, s + col); its `<|vision_end|>` at s + max(H', W') = s + 4 whatever was kept (an
    emptied group too). Each kept token must sit in the block of the group it came from. Returns the
    item's positions and where what follows it starts."""
    flats = iter(kept)
    group, expected, i = -1, [], 0
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
    return expected, p


def test_qwen3_positions_by_hand(dense_runs, dense):
    """The positions the LLM received, against `_by_hand`; the text after the video at the next position."""
    config = dense.model.config
    for method in ("ottvid", "holitom", "evs"):
        run = dense_runs[method]
        start, layout = _item(run, dense)
        positions = np.array([row[: len(run["prompt_token_ids"])] for row in run["positions"]])
        (kept,) = run["kept"]
        expected, after = _by_hand(layout, kept, int(positions[:, start - 1].max()) + 1, config)
        assert positions[:, start:start + len(layout)].T.tolist() == expected, method
        assert positions[:, start + len(layout)].tolist() == [after] * 3


def test_qwen3_an_image_beside_the_video_by_hand(dense_runs, dense):
    """An image (64 x 64: 2 x 2 merged tokens) before the video in one request: the image's tokens at
    (s, s + row, s + col) one past its `<|vision_start|>`, what follows it at s + 2; the video as
    `_by_hand` from there; the question after it."""
    run, config = dense_runs["image+video"], dense.model.config
    ids = run["prompt_token_ids"]
    positions = check_image_before_video(run, config)
    start, layout = _item(run, dense)
    (kept,) = run["kept"]
    expected, after = _by_hand(layout, kept, int(positions[:, start - 1].max()) + 1, config)
    assert positions[:, start:start + len(layout)].T.tolist() == expected
    assert positions[0, start + len(layout):].tolist() == list(range(after, after + len(ids) - start - len(layout)))


@pytest.fixture(scope="module")
def qwen3_server(vllm_env, tiny_qwen3_vllm, tmp_path_factory):
    """vLLM's own OpenAI server serving the tiny Qwen3-VL with docs/vllm.md's spellings (q = 0.9), local videos
    under `media`, 8 frames a video."""
    from benchmarks.envs.vllm_env import VllmEnvError, serving

    media = tmp_path_factory.mktemp("vllm_qwen3_media")
    log = tmp_path_factory.mktemp("vllm_qwen3_server_log") / "server.log"
    args = ["--video-pruning-rate", "0.9", "--hf-overrides", '{"ottvid_method": "ottvid"}',
            "--allowed-local-media-path", str(media), "--limit-mm-per-prompt", '{"video": 1}',
            "--media-io-kwargs", '{"video": {"num_frames": 8}}', "--enable-prompt-tokens-details"]
    try:
        with serving(vllm_env.python, tiny_qwen3_vllm, args, log) as url:
            yield f"{url}/v1", media
    except VllmEnvError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_qwen3_server_with_the_issue_spellings_and_the_openai_client(qwen3_server, tiny_qwen3_vllm, dense):
    """`vllm serve` with `--video-pruning-rate 0.9 --hf-overrides '{"ottvid_method": "ottvid"}'`, the official
    client, a file:// video_url: an answer, and exactly round(0.1 x 64) = 6 video tokens in the prompt (8
    frames of 4 x 4 tokens a group; vLLM's own count would be max(16, int(6.4)) = 16), every group's
    timestamp and markers kept."""
    from openai import OpenAI

    url, media = qwen3_server
    clip = write_clip(media / "clip.mp4", side=SIDE)
    client = OpenAI(base_url=url, api_key="unused")
    reply = client.chat.completions.create(
        model=str(tiny_qwen3_vllm), max_tokens=8, temperature=0, extra_body={"return_token_ids": True},
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                                               {"type": "text", "text": QUESTION}]}])
    assert reply.choices[0].message.content is not None
    ids = reply.prompt_token_ids
    assert len(ids) == reply.usage.prompt_tokens
    config = dense.model.config
    assert ids.count(config.video_token_id) == round(0.1 * V) == 6
    # 4 groups' blocks in place of the template's <|vision_start|><|video_pad|><|vision_end|>, as trained
    assert ids.count(config.vision_start_token_id) == ids.count(config.vision_end_token_id) == FRAMES // 2


def test_qwen3_text_after_a_cached_video_keeps_its_positions(qwen3_server, tiny_qwen3_vllm, dense):
    """vLLM's prefix cache (on by default) holds the video on a repeat: the text after it must keep the
    trained positions without the model seeing the video again (the plugin's `get_mrope_input_positions`;
    vLLM's own give a lumped run shorter than a group a whole group's positions)."""
    from openai import OpenAI

    url, media = qwen3_server
    clip = write_clip(media / "cached.mp4", side=SIDE)
    check_prefix_cache(OpenAI(base_url=url, api_key="unused"), str(tiny_qwen3_vllm), clip,
                       dense.model.config.vision_end_token_id)
