"""What every backbone provides, and the loading rules they share (device, dtype, clear errors)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch


from ..settings import ModelError  # defined without torch, so the CLI can catch it before importing torch


@dataclass
class VisualTokens:
    """A video's visual tokens as the LLM would receive them, with their per-group saliency.

    features: (T, N, D), tokens of each temporal group in raster order of the (H, W) grid;
    saliency: (T, N) >= 0 or None (not computed); grid: (H, W) with H * W = N.
    extra: other per-token encoder outputs the LLM needs, each compressed with the same decisions
    as `features` (Qwen3-VL: "deepstack", a tuple of (T, N, D) tensors); empty for most models.
    """

    features: torch.Tensor
    saliency: torch.Tensor | None
    grid: tuple[int, int]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.features.shape[0] * self.features.shape[1]


@dataclass
class Generated:
    """The model's reply and what it cost: LLM input length and prefill / decoding wall times."""

    text: str
    llm_input_tokens: int
    new_tokens: int
    prefill_ms: float
    generate_ms: float
    extra: dict[str, Any] = field(default_factory=dict)


class Backbone(Protocol):
    """A Video-LLM adapter: preprocess frames, encode them to visual tokens, generate with a subset kept."""

    name: str
    device: torch.device
    frames_per_group: int  # frames encoded together into one temporal group
    default_frames: int  # frames `ask` samples by default
    grounds: bool  # whether the model is trained to answer with time spans
    official_overrides: dict  # OTTVidConfig.official() overrides that reproduce the authors' code on this model

    def preprocess(self, frames, timestamps: list[float], duration: float, prompt: str) -> Any: ...

    def encode(self, inputs: Any, saliency: bool = True, watch: Any = None) -> VisualTokens: ...

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   assignment: torch.Tensor | None = None) -> dict[str, Any]:
        """generate() / forward kwargs with only the kept visual tokens (features (M, D) at ascending flat
        indices `kept` (M,)): input_ids, attention_mask, mm_encoder_outputs and, for M-RoPE models,
        position_ids (4, B, L') (row 0 the sequence index 0..L'-1, rows 1-3 the uncompressed M-RoPE
        positions of what was kept; see docs/positions.md). `assignment` (T*N,) (`Compressed.assignment`)
        lets a model merge its other per-token tensors (Qwen3-VL's DeepStack) the same way; the others
        ignore it."""
        ...

    def generate(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor, max_new_tokens: int,
                 on_token: Callable[[str], None] | None = None, assignment: torch.Tensor | None = None) -> Generated: ...

    def prefill(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                assignment: torch.Tensor | None = None) -> int: ...

    def newline_tokens(self, groups: int) -> int: ...

    def flops(self, inputs: Any, llm_tokens: int) -> tuple[float, float]: ...


def resolve_device(device: str = "auto") -> torch.device:
    """"auto" picks cuda, then mps, then cpu; anything else must be available."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ModelError(f"unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("device cuda was asked for but no CUDA GPU is available (try --device cpu)")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelError("device mps was asked for but is not available (try --device cpu)")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """"auto": bfloat16 on GPUs, float32 on the CPU."""
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return table[dtype]


def attention_implementation(requested: str = "auto") -> str:
    """sdpa unless flash-attention is installed and asked for; eager on request."""
    if requested in ("auto", "sdpa"):
        return "sdpa"
    if requested == "eager":
        return "eager"
    if requested in ("flash_attention_2", "flash"):
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            raise ModelError("flash attention was asked for but the flash-attn package is not installed") from None
        return "flash_attention_2"
    raise ModelError(f"unknown attention implementation {requested!r}: use auto, sdpa, eager or flash")


def is_local(model_id: str) -> bool:
    return os.path.isdir(os.path.expanduser(model_id))


class KeptTokenGeneration:
    """generate / prefill / prefill_logits for an adapter that builds its LLM inputs from the kept
    visual tokens with `llm_inputs(inputs, features, kept)` and has `model`, `processor`, `device`."""

    @torch.inference_mode()
    def generate(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor, max_new_tokens: int = 64,
                 on_token: Callable[[str], None] | None = None, assignment: torch.Tensor | None = None) -> Generated:
        """Greedy generation from the kept visual tokens; measures prefill (time to first token) and
        decoding. `on_token` receives the reply's new text as each token is generated. `assignment`
        (`Compressed.assignment`) goes to `llm_inputs` for models that compress more than the main
        features with it (Qwen3-VL's DeepStack)."""
        from ..timing import synchronize

        llm = self._llm_inputs(inputs, features, kept, assignment)
        tokenizer = self.processor.tokenizer
        stream = _TokenStream(self.device, tokenizer, on_token)
        start = time.perf_counter()
        out = self.model.generate(**llm, max_new_tokens=max_new_tokens, do_sample=False, streamer=stream,
                                  pad_token_id=tokenizer.pad_token_id)
        synchronize(self.device)
        end = time.perf_counter()
        new = out[:, llm["input_ids"].shape[1]:]
        text = tokenizer.batch_decode(new, skip_special_tokens=True)[0].strip()
        first = stream.first if stream.first is not None else end
        return Generated(text=text, llm_input_tokens=int(llm["input_ids"].shape[1]), new_tokens=int(new.shape[1]),
                         prefill_ms=(first - start) * 1e3, generate_ms=(end - first) * 1e3)

    @torch.inference_mode()
    def prefill(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                assignment: torch.Tensor | None = None) -> int:
        """One prefill forward (KV cache filled, logits for the last position only, as generate()
        does before its first token); returns the LLM input length."""
        llm = self._llm_inputs(inputs, features, kept, assignment)
        self.model(**llm, use_cache=True, logits_to_keep=1)
        return int(llm["input_ids"].shape[1])

    @torch.inference_mode()
    def prefill_logits(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                       assignment: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one forward pass over the (compressed) prompt: (B, L', vocab)."""
        return self.model(**self._llm_inputs(inputs, features, kept, assignment)).logits

    def _llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                    assignment: torch.Tensor | None) -> dict[str, Any]:
        return self.llm_inputs(inputs, features, kept, assignment=assignment)


class _TokenStream:
    """A generate() streamer: records when the first new token is ready and, with `on_token`, hands
    on the reply's text as it grows (decoded from all new tokens so far, held back while the last
    token ends inside a multi-byte character). The library never prints; the callback decides."""

    def __init__(self, device: torch.device, tokenizer: Any = None, on_token: Callable[[str], None] | None = None):
        self.device = device
        self.tokenizer = tokenizer
        self.on_token = on_token
        self.calls = 0
        self.first: float | None = None
        self.ids: list[int] = []
        self.sent = 0

    def put(self, value) -> None:
        from ..timing import synchronize

        self.calls += 1
        if self.calls == 1:  # call 1 is the prompt, then one call per new token
            return
        if self.first is None:
            synchronize(self.device)
            self.first = time.perf_counter()
        if self.on_token is not None:
            self.ids.extend(int(v) for v in value.reshape(-1).tolist())
            self._emit(final=False)

    def end(self) -> None:
        if self.on_token is not None:
            self._emit(final=True)

    def _emit(self, final: bool) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).lstrip()
        if not final:
            text = text.rstrip("\ufffd")
        if len(text) > self.sent:
            self.on_token(text[self.sent:])
            self.sent = len(text)
