"""The request and response bodies of `ottvid serve`, OpenAI's chat-completions shape plus our
`ottvid` field. Checks on our settings reuse the command line's (`checks.check_*`), so a bad
ratio reads the same from the server as from `ottvid ask`."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator

from ..checks import DEFAULT_MAX_FRAMES, check_choice, check_count, check_positive, check_ratio
from ..method_catalog import METHODS, PRESETS

TASKS = ("ask", "ground")
MAX_NEW_TOKENS = 4096  # a request asking for more is refused (each token is a forward pass)
DEFAULT_TOKENS = {"ask": 64, "ground": 48}  # `ottvid ask` / `ground`'s --max-new-tokens


# ------------------------------------------------------------------------------------------------
# requests


def _unicode(value: str) -> str:
    """`value` if it is Unicode text: JSON's \\ud800 escapes can spell a lone surrogate, which no UTF-8
    text holds (a tokenizer, a file name or a reply cannot carry it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x} at character "
                         f"{exc.start}), which is not Unicode text") from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]


class VideoURL(BaseModel):
    url: Text


class ContentPart(BaseModel):
    """One part of a message's content: `text`, or `video_url` (what vLLM and SGLang accept). Other
    types (`image_url`, `input_audio`) are refused by the app with a clear message."""

    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None
    video_url: VideoURL | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, v):
        return _unicode(v) if isinstance(v, str) else v


class OttvidOptions(BaseModel):
    """The `ottvid` extra body field: what `ottvid ask` / `ground` take as flags."""

    model_config = ConfigDict(extra="forbid")
    task: Literal["ask", "ground"] = "ask"
    ratio: float | None = None
    method: str = "ottvid"
    preset: str = "paper"
    frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    choices: list[Text] | None = Field(default=None, description="Multiple-choice options ('A. a dog'), ask only.")
    method_args: list[Text] | None = Field(default=None, description="The method's options as `--method-arg` takes "
                                                                    "them: ['d=0.3', 'exact=false'].")
    picture: bool = Field(default=False, description="Also return the `show` picture of what compression kept "
                                                     "(`ottvid.picture.image`, a PNG data: URL).")
    point: bool = Field(default=False, description="ground only: the query names a moment, so one time is asked "
                                                   "for and `span` is [t, t] (`ottvid ground --point`).")
    keyframes: bool = Field(default=False, description="Each frame the key frame nearest its planned time, read "
                                                       "alone (`ottvid ask --keyframes`).")

    # the numbers are checked as sent (mode "before"): `true` is not 1, "0.5" is not 0.5
    @field_validator("ratio", mode="before")
    @classmethod
    def _ratio(cls, v):
        return v if v is None else check_ratio(v, "ratio")

    @field_validator("method")
    @classmethod
    def _method(cls, v):
        return check_choice(v, "method", METHODS)

    @field_validator("preset")
    @classmethod
    def _preset(cls, v):
        return check_choice(v, "preset", PRESETS)

    @field_validator("frames", "max_frames", mode="before")
    @classmethod
    def _count(cls, v, info):
        return v if v is None else check_count(v, info.field_name)

    @field_validator("fps", mode="before")
    @classmethod
    def _fps(cls, v):
        return v if v is None else check_positive(v, "fps")

    @field_validator("picture", "point", "keyframes", mode="before")
    @classmethod
    def _boolean(cls, v, info):  # a JSON boolean only: not 1, "true" or "yes"
        if not isinstance(v, bool):
            raise ValueError(f"{info.field_name} must be true or false, got {json.dumps(v)[:40]}")
        return v

    def sampling(self, max_pixels: int | None = None, decoder: str = "auto", limit: int = DEFAULT_MAX_FRAMES,
                 default_frames: int | None = None):
        """The frames to take, as the command line picks them: `frames` (the model's `default_frames`,
        or the server's `limit` if lower), or `fps` capped at `max_frames` (768, or `limit` if lower);
        ground samples at 2 fps when neither is given. ValueError for `frames` with `fps`, or
        `max_frames` without `fps`."""
        from ..sampling import Sampling

        fps = self.fps if self.frames is not None or self.fps is not None or self.task == "ask" else 2.0
        max_frames = self.max_frames if self.max_frames is not None or fps is None else min(DEFAULT_MAX_FRAMES, limit)
        frames = self.frames
        if frames is None and fps is None and default_frames is not None and default_frames > limit:
            frames = limit
        return Sampling(frames=frames, fps=fps, max_frames=max_frames, max_pixels=max_pixels, decoder=decoder,
                        keyframes=self.keyframes)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class ChatRequest(BaseModel):
    """POST /v1/chat/completions. OpenAI fields we do not use (temperature, top_p, seed, ...) are
    accepted and ignored: decoding is greedy."""

    model_config = ConfigDict(extra="allow")
    model: Text
    messages: list[Message] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    n: int = Field(default=1, ge=1, le=1)
    ottvid: OttvidOptions = Field(default_factory=OttvidOptions)

    @field_validator("max_tokens", "max_completion_tokens", "n", mode="before")
    @classmethod
    def _integer(cls, v, info):  # a JSON integer only: not true, "4" or 4.0
        if isinstance(v, bool):
            raise ValueError(f"{info.field_name} must be an integer, got {str(v).lower()}")
        return v if v is None else check_count(v, info.field_name)


# ------------------------------------------------------------------------------------------------
# responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    """The reply; `ottvid` is `ask --json`'s object (`RunResult.to_dict()`: `cache_hit`, `tokens`,
    `timings_ms`, `span`, `frames`, `compression`, ...)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    ottvid: dict[str, Any]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ottvid"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def usage_of(run: dict[str, Any]) -> Usage:
    """OpenAI's usage from a run: the LLM's input (kept visual + text tokens) and the generated ones."""
    tokens = run.get("tokens") or {}
    prompt, completion = int(tokens.get("llm_input", 0)), int(tokens.get("generated", 0))
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
