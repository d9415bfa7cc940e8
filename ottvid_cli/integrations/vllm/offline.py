"""An in-process `vllm.LLM` running one of ottvid's methods through the plugin: what `ottvid eval --engine vllm`
drives (docs/eval.md). Imported only by that engine; it imports vLLM.

One engine per setting (the pruning rate is an engine setting in vLLM). Frames come decoded, sampled and
resized by ottvid, the benchmark protocol's, as an array with their metadata, so vLLM's processor neither
samples (`do_sample_frames` False) nor resizes (`do_resize` False) them: the pixels are the ones ottvid's own
engine encodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .settings import kept_share

# what the engine sets itself from the run's settings; --engine-arg may not give them
RESERVED = {"model": "--model", "video_pruning_rate": "--method / --ratio", "tensor_parallel_size":
            "--tensor-parallel-size", "limit_mm_per_prompt": "(one video a prompt)", "seed": "(0: greedy replies)"}


def pruning_rate(ratio: float) -> float:
    """vLLM's q for a kept share: 1 - ratio in decimal, so that the plugin's 1 - q is the ratio exactly."""
    return kept_share(ratio)  # 1 - x both ways


def engine_arguments(model: str, method: str, ratio: float, *, preset: str = "paper", tensor_parallel_size: int = 1,
                     dtype: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """`vllm.LLM`'s keyword arguments for one setting: the plugin's method at q = 1 - ratio (stock vLLM for
    "none"), one video a prompt and `extra` (--engine-arg; its hf_overrides are kept beside the plugin's)."""
    extra = dict(extra or {})
    overrides = dict(extra.pop("hf_overrides", None) or {})
    kwargs: dict[str, Any] = {"model": model, "tensor_parallel_size": tensor_parallel_size,
                              "limit_mm_per_prompt": {"video": 1, "image": 0}, "seed": 0}
    if dtype not in (None, "auto"):
        kwargs["dtype"] = dtype
    if method != "none":
        kwargs["video_pruning_rate"] = pruning_rate(ratio)
        overrides.update(ottvid_method=method, ottvid_preset=preset)
    if overrides:
        kwargs["hf_overrides"] = overrides
    return {**kwargs, **extra}


class RequestRefused(ValueError):
    """vLLM refused one request (e.g. its prompt is longer than max_model_len); the others go on."""


@dataclass
class Reply:
    """What vLLM answered one request: the generated token ids (their text is the caller's: `reply_text`), the
    prompt's tokens (the video's among them)."""

    ids: list[int]
    prompt_tokens: int
    video_tokens: int


class OfflineEngine:
    """One `vllm.LLM` for one setting. `add` queues a request and returns its place among the queued ones
    (RequestRefused for a request vLLM refuses, e.g. a prompt longer than max_model_len: the others are
    unaffected); `finish` runs every queued request to the end, vLLM batching them, and returns the replies
    in that order; `close` frees the engine. vLLM's log goes to stderr (stdout may be --json's)."""

    def __init__(self, kwargs: dict[str, Any]):
        import os

        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # before vLLM configures its logging
        from vllm import LLM

        self.llm = LLM(**kwargs)
        self.video_token = self.llm.llm_engine.model_config.hf_config.video_token_id
        self.queued = 0

    def add(self, prompt: str, frames: np.ndarray, metadata: dict[str, Any], max_tokens: int) -> int:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError

        request = {"prompt": prompt, "multi_modal_data": {"video": (frames, {**metadata, "do_sample_frames": False})},
                   "mm_processor_kwargs": {"do_resize": False}}
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        try:
            self.llm.enqueue(request, params, use_tqdm=False)
        except (VLLMClientError, ValueError) as exc:  # this request's own refusal (vLLM's 4xx kind)
            raise RequestRefused(" ".join(str(exc).split())) from None
        self.queued += 1
        return self.queued - 1

    def finish(self) -> list[Reply]:
        # the replies in the order the requests were queued (vLLM returns them by its request counter)
        outputs, self.queued = self.llm.wait_for_completion(use_tqdm=False), 0
        replies = []
        for output in outputs:
            ids = list(output.prompt_token_ids or [])
            replies.append(Reply(ids=list(output.outputs[0].token_ids), prompt_tokens=len(ids),
                                 video_tokens=ids.count(self.video_token)))
        return replies

    def close(self) -> None:
        """Shut the engine down (its processes, its memory) before the next setting's starts."""
        import gc

        import torch

        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        del self.llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
