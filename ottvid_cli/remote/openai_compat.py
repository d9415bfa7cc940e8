"""`ottvid ask / ground --server URL` against a plain OpenAI-compatible server: vLLM's `vllm serve`
(with ottvid's plugin or without), or any server that answers chat completions with a `video_url`.

Which kind of server: GET /v1/models. `ottvid serve` lists its model as owned by "ottvid"; a model
owned by anyone else ("vllm" for vLLM) is a plain server. To a plain server ottvid sends what a
local run would put before the model: the prompt a local run builds (`tasks.qa.build_prompt`,
`tasks.grounding.build_prompt`) after the video, and reads the reply as a local run reads it (the
option letter, the time span). What such a server does not return (the frames it sampled, the
tokens each stage kept, the compression report, the stages' times, the device) is None in the
result: null in --json, "unknown" in the report, never guessed. What it does return is kept: its
usage (`tokens.llm_input` is its prompt_tokens, `tokens.generated` its completion_tokens) and, when
vLLM runs with --enable-per-request-metrics, its timing metrics (`server_metrics`, vLLM's names).

Settings that vLLM fixes when its server starts, for every request, cannot be asked per request:
the method and its options (`--hf-overrides '{"ottvid_method": ..., "ottvid_method_args": ...}'`),
the share kept (`--video-pruning-rate q`: 1 - q is kept) and the preset; the command line refuses
them (`not_per_request`). The sampling rate does go per request: vLLM 0.32 takes `media_io_kwargs`
(`{"video": {"fps": F, "max_frames": M}}`) when its server runs with --trust-request-mm-kwargs
(without it vLLM refuses the request, saying so); without --fps its own sampling applies (for
Qwen2.5-VL: 2 frames a second, at most 768, as `ottvid ground` samples). A frame count has no
equivalent: vLLM's Qwen-VL loaders sample by rate and ignore `num_frames`, so --frames is refused.
Nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..checks import STAGES
from ..tasks import grounding, qa

OTTVID_OWNER = "ottvid"  # `owned_by` of `ottvid serve`'s model card (schema.ModelCard)

# The flags of ask / ground that a plain server does not take per request, and why.
NOT_PER_REQUEST = {
    "--method": "it runs the method it was started with (vLLM: --hf-overrides '{\"ottvid_method\": NAME}')",
    "--ratio": "it keeps the share of video tokens it was started with (vLLM: --video-pruning-rate q keeps 1 - q)",
    "--method-arg": "it takes a method's options when it starts (vLLM: --hf-overrides "
                    "'{\"ottvid_method_args\": {...}}')",
    "--preset": "it takes OTT-Vid's preset when it starts (vLLM: --hf-overrides '{\"ottvid_preset\": NAME}')",
    "--frames": "vLLM samples a Qwen-VL video by rate and ignores a frame count: give --fps (sent as "
                "media_io_kwargs)",
    "--keyframes": "it decodes every frame it samples itself (vLLM's video loaders read no key frames alone)",
}

# A local run's `tokens` (pipeline.Prepared.tokens): of these a plain server returns llm_input and generated.
TOKEN_KEYS = ("visual_before", "after_spatial", "visual_after", "llm_input", "text", "newline", "groups",
              "per_group", "grid", "merges", "prunes", "generated")


def is_ottvid_serve(card: dict[str, Any]) -> bool:
    """Whether the model card (GET /v1/models) is one of `ottvid serve`."""
    return card.get("owned_by") == OTTVID_OWNER


def not_per_request(given: list[str], owner: str | None) -> str | None:
    """The one-line refusal of the first flag in `given` that a plain server does not take per request,
    or None."""
    for flag in given:
        if flag in NOT_PER_REQUEST:
            return (f"{flag} does not apply to this server ({owner or 'an OpenAI-compatible server'}, not ottvid "
                    f"serve): {NOT_PER_REQUEST[flag]}")
    return None


def media_io_kwargs(fps: float | None, max_frames: int | None) -> dict[str, Any] | None:
    """vLLM's per-request `media_io_kwargs` for --fps F (at most `max_frames`), None without --fps (the
    server's own sampling applies). vLLM's Qwen-VL loaders read `fps` and `max_frames`, its generic
    loader `fps` and `num_frames`: both are sent."""
    if fps is None:
        return None
    cap = {"max_frames": max_frames, "num_frames": max_frames} if max_frames is not None else {}
    return {"video": {"fps": fps, **cap}}


@dataclass(frozen=True)
class PlainServer:
    """ask / ground at a plain server: the prompt a local run builds for each question, the body that
    carries it after the video, and the reply read into a local run's document."""

    task: str
    owner: str | None = None  # the model card's owned_by ("vllm")
    choices: list[str] | None = None
    point: bool = False
    max_new_tokens: int | None = None
    media: dict[str, Any] | None = None  # `media_io_kwargs`
    video: str = ""  # as given on the command line
    duration: float | None = None  # the local file's length (s), which a span is clipped to; None: unknown

    def prompt(self, text: str) -> str:
        if self.task == "ask":
            return qa.build_prompt(text, self.choices)
        return grounding.build_prompt(text, self.point)

    def body(self, model: str, url: str, text: str, stream: bool = False) -> dict[str, Any]:
        """The chat-completions body: the video, then the prompt; greedy decoding, as a local run's."""
        body: dict[str, Any] = {
            "model": model, "temperature": 0.0,
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                      {"type": "text", "text": self.prompt(text)}]}]}
        if self.max_new_tokens is not None:
            body["max_tokens"] = self.max_new_tokens
        if self.media:
            body["media_io_kwargs"] = self.media
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def send(self, client: Any, model: str, url: str, text: str, on_token=None) -> dict[str, Any]:
        """One question through `client` (a `client.Client`): the document of its run."""
        return self.result(client.chat(self.body(model, url, text, on_token is not None), on_token), text,
                           client.base)

    @staticmethod
    def path_refused(error: Exception) -> bool:
        """Whether the server's error says it may not read the file:// path (vLLM: outside, or without,
        --allowed-local-media-path): the file is then uploaded."""
        return "allowed-local-media-path" in str(error)

    def result(self, reply: dict[str, Any], text: str, server: str) -> dict[str, Any]:
        """The document of a local run (`RunResult.to_dict`) from a plain server's completion: the
        answer read as a local run reads it (the letter; the span, clipped to the video's duration
        when it is known), what the server returned, and None for everything it did not."""
        choice = (reply.get("choices") or [{}])[0]
        answer = (choice.get("message") or {}).get("content") or ""
        usage = reply.get("usage") or {}
        tokens: dict[str, Any] = dict.fromkeys(TOKEN_KEYS)
        tokens.update(llm_input=usage.get("prompt_tokens"), generated=usage.get("completion_tokens"))
        data: dict[str, Any] = {
            "task": self.task, "video": self.video, "model": reply.get("model"), "device": None, "dtype": None,
            "method": None, "ratio": None, "prompt": self.prompt(text), "answer": answer, "letter": None,
            "span": None, "frames": None, "tokens": tokens, "compression": None,
            "timings_ms": dict.fromkeys(("load", *STAGES)), "cache_hit": None,
            "server": {"url": server, "owned_by": self.owner}, "server_metrics": reply.get("metrics"),
        }
        if self.task == "ask":
            data["letter"] = qa.parse_letter(answer, self.choices) if self.choices else None
        else:
            span = grounding.parse_span(answer, math.inf if self.duration is None else self.duration, self.point)
            data["span"] = list(span) if span is not None else None
            data["span_note"] = grounding.span_note(answer, self.point) if span is None else None
        return data
