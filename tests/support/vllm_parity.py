"""What the vLLM end-to-end tests share (tests/test_vllm_plugin.py, tests/test_vllm_qwen3.py): a job in the vLLM
environment (tests/support/vllm_job.py) and ottvid_cli's own answer on the same frames."""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import torch

from benchmarks.envs.vllm_env import run_env
from ottvid_cli.compression import methods

HERE = pathlib.Path(__file__).resolve().parent
QUESTION = "What happens in the video?"
# a question long enough that vLLM's prefix cache (whole blocks only) holds the whole video on a repeat
LONG_QUESTION = QUESTION + " Describe every detail of the scene carefully, from the first frame to the last." * 3


def write_clip(path: pathlib.Path, frames: int = 16, rate: int = 4, side: int = 112) -> pathlib.Path:
    """A side x side MPEG-4 clip of random frames (112: the tiny Qwen2.5-VL processor's largest frame, 4 x 4
    tokens a group; 128 for the tiny Qwen3-VL's)."""
    import av

    rng = np.random.default_rng(1)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        for _ in range(frames):
            image = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path


RUNNERS = ["v1", "v2"]  # vLLM's Model Runner V1 and V2 (V2 through Triton's interpreter: tests/support/vllm_job.py)
RUNNER_CLASSES = {"v1": "vllm.v1.worker.cpu_model_runner.CPUModelRunner",
                  "v2": "vllm.v1.worker.cpu.model_runner.CPUModelRunner"}


def check_runner(run: dict, runner: str) -> None:
    """The job ran on the runner asked for; on V1 the CPU runner's pruning flag is on for a model that asks
    (`cpu_runner.patch`; V2 prunes through its `MultiModalPruner`, which has no such flag)."""
    assert run["runner"] == RUNNER_CLASSES[runner]
    if runner == "v1":
        assert run["pruning_flag"] and run["plugin_scope_enables"]


def prompt_text(backbone) -> str:
    from ottvid_cli.backbones.base import chat_text

    return chat_text(backbone.processor, QUESTION)


def run_job(vllm_env, tmp_path, **job) -> list[dict]:
    """One job (tests/support/vllm_job.py) in the vLLM environment: its runs."""
    return run_jobs(vllm_env, tmp_path, job)[0]


def run_jobs(vllm_env, tmp_path, *jobs: dict, script: str = "vllm_job.py") -> list[list[dict]]:
    """Jobs one after the other (vLLM's CPU engines side by side, beside a running server, spin on the same
    two cores and can take many minutes), each run by `script` (beside this file); each job's runs, in order."""
    results = []
    for job in jobs:
        path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.json"
        path.write_text(json.dumps(job))
        done = subprocess.run([str(vllm_env.python), str(HERE / script), str(path)], capture_output=True,
                              text=True, timeout=900, env=run_env(VLLM_CPU_NUM_OF_RESERVED_CPU="0"))
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def ours_at(backbone, clip_path: pathlib.Path, method: str, ratio: float, fps: float = 2.0):
    """ottvid_cli on the same frames at `fps`: kept indices, positions (3, L'), the LLM's token ids and the
    first-token log-probabilities."""
    frames = np.load(clip_path)
    timestamps = [i / fps for i in range(len(frames))]
    inputs = backbone.preprocess(frames, timestamps, len(frames) / fps, QUESTION)
    tokens = backbone.encode(inputs)
    out = methods.compress_with(method, tokens.features, tokens.saliency, tokens.grid, ratio=ratio)
    llm = backbone.kept_sequence(inputs, out.index)
    logits = backbone.prefill_logits(inputs, out.features, out.index, compressed=out)
    return {"kept": out.index.tolist(), "positions": llm["position_ids"][1:, 0].tolist(),
            "ids": llm["input_ids"][0].tolist(), "logprobs": torch.log_softmax(logits[0, -1].float(), -1)}




def check_prefix_cache(client, model: str, clip: pathlib.Path, vision_end: int) -> None:
    """The same request twice to a server with prefix caching (vLLM's default): the first computes
    everything, the second finds the video in the cache (it is never handed to the model again, so the
    text after it keeps the first positions the model gave the prompt); both give the same first-token
    log-probabilities. `--enable-prompt-tokens-details` says how much the cache held."""
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                                             {"type": "text", "text": LONG_QUESTION}]}]
    first, second = (client.chat.completions.create(model=model, max_tokens=1, temperature=0, logprobs=True,
                                                    top_logprobs=5, messages=messages,
                                                    extra_body={"return_token_ids": True}) for _ in range(2))
    ids = second.prompt_token_ids
    after_video = len(ids) - ids[::-1].index(vision_end)  # one past the video's last <|vision_end|>
    assert second.usage.prompt_tokens_details.cached_tokens >= after_video
    assert (first.usage.prompt_tokens_details.cached_tokens or 0) < after_video
    tops = [reply.choices[0].logprobs.content[0].top_logprobs for reply in (first, second)]
    assert [entry.bytes for entry in tops[0]] == [entry.bytes for entry in tops[1]]
    for before, after in zip(*tops):
        assert abs(before.logprob - after.logprob) < 1e-4, tops


def check_image_before_video(run: dict, config) -> "np.ndarray":
    """The image+video run (tests/support/vllm_job.py): the image's 2 x 2 tokens at (s, s + row, s + col), s one past
    its `<|vision_start|>`, and what follows it at s + max(2, 2). Returns the positions (3, L) for the
    video's checks."""
    ids = run["prompt_token_ids"]
    positions = np.array([row[: len(ids)] for row in run["positions"]])
    at = ids.index(config.image_token_id)
    assert ids[at:at + 5] == [config.image_token_id] * 4 + [config.vision_end_token_id]
    s = int(positions[:, at - 1].max()) + 1
    assert positions[:, at:at + 4].T.tolist() == [[s, s, s], [s, s, s + 1], [s, s + 1, s], [s, s + 1, s + 1]]
    assert positions[:, at + 4].tolist() == [s + 2] * 3
    return positions
