"""What every backbone provides, and the loading rules they share (device, dtype, clear errors)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch


from ..model_source import ModelError  # defined without torch, so the CLI can catch it before importing torch


@dataclass
class VisualTokens:
    """A video's visual tokens as the LLM would receive them, with their per-group saliency.

    features: (T, N, D), tokens of each temporal group in raster order of the (H, W) grid;
    saliency: (T, N) >= 0 or None (not computed); grid: (H, W) with H * W = N.
    extra: other per-token encoder outputs the LLM needs, each compressed with the same decisions
    as `features` (Qwen3-VL: "deepstack", a tuple of (T, N, D) tensors); empty for most models.
    signals: encoder outputs that compression methods may read besides the features, passed to every
    method as `signals=` (docs/methods.md, "Per-backbone paths and signals"): "frame_features" (T, D')
    and "attention" (T, N) float tensors, "source" a string naming where they came from; empty when
    the backbone computes none (LLaVA-OneVision with a SigLIP head computes both).
    """

    features: torch.Tensor
    saliency: torch.Tensor | None
    grid: tuple[int, int]
    extra: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.features.shape[0] * self.features.shape[1]


MAX_ASPECT = 200  # the Qwen processors' smart_resize (qwen-vl-utils' and transformers') refuse frames beyond


def check_aspect(height: int, width: int, model: str) -> None:
    """A one-line VideoError for frames whose sides differ by more than MAX_ASPECT times, which the Qwen
    processors' resize refuses (with a ValueError of theirs, which would otherwise read as our bug)."""
    from ..video import VideoError

    if max(height, width) > MAX_ASPECT * max(min(height, width), 1):
        raise VideoError(f"frames of {width} x {height} pixels: {model} takes frames whose long side is at most "
                         f"{MAX_ASPECT} times the short one")


@dataclass
class Generated:
    """The model's reply and what it cost: LLM input length and prefill / decoding wall times."""

    text: str
    llm_input_tokens: int
    new_tokens: int
    prefill_ms: float
    generate_ms: float
    extra: dict[str, Any] = field(default_factory=dict)
    prefix: "Prefix | None" = field(default=None, repr=False)  # the KV cache of the prompt's prefix, to reuse
    prefilled_tokens: int | None = None  # tokens this run prefilled (llm_input_tokens less a reused prefix)


@dataclass
class Prefix:
    """The KV cache of a prompt's question-independent prefix (system prompt and video, up to the
    last video token), with the ids and positions it was computed for (a prompt whose first `length`
    tokens differ cannot use it). `copy()` is what a question continues from; this one stays intact."""

    cache: Any = field(repr=False)  # transformers DynamicCache holding `length` tokens
    length: int
    input_ids: torch.Tensor = field(repr=False)
    position_ids: torch.Tensor | None = field(repr=False, default=None)
    visual: tuple = field(repr=False, default=())  # `_visual_key` of what it was computed from

    def matches(self, llm: dict[str, Any], visual: tuple = ()) -> bool:
        """Whether a prompt (its LLM inputs, and the visual tokens they place) starts with this prefix."""
        if len(visual) != len(self.visual) or not all(_same(a, b) for a, b in zip(visual, self.visual)):
            return False
        ids = llm["input_ids"]
        if ids.shape[1] <= self.length or not torch.equal(ids[:, :self.length], self.input_ids.to(ids.device)):
            return False
        positions = _prefix_positions(llm, self.length)
        return (positions is None) == (self.position_ids is None) and (
            positions is None or torch.equal(positions, self.position_ids.to(positions.device)))

    def copy(self) -> Any:
        """A cache to continue from, sharing this prefix's keys and values: a DynamicCache's plain
        layers grow by concatenation (each update makes new tensors, never writes into the ones
        held), so the prefix stays intact without copying every layer (a deep copy for other layers)."""
        import copy

        from transformers.cache_utils import DynamicLayer

        layers = getattr(self.cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            return copy.deepcopy(self.cache)
        shared = copy.copy(self.cache)
        shared.layers = [copy.copy(layer) for layer in layers]
        return shared

    @property
    def nbytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if torch.is_tensor(t):
                    total += t.numel() * t.element_size()
        return total


def prefix_length(inputs: Any, llm: dict[str, Any], video_token_id: int) -> int:
    """Tokens of the LLM input (kept sequence `llm`) up to and including the last video token: every
    visual token and nothing of the question. The tokens after the last video token are the same in
    the uncompressed prompt (`inputs`) and in the kept sequence."""
    ids = inputs["input_ids"][0]
    slots = (ids == video_token_id).nonzero().flatten()
    if slots.numel() == 0:
        raise ValueError("the prompt holds no video tokens")
    after = ids.shape[0] - int(slots[-1]) - 1
    return int(llm["input_ids"].shape[1]) - after


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    return a.shape == b.shape and torch.equal(a, b.to(a.device))


def _visual_key(features: torch.Tensor, kept: torch.Tensor, compressed: Any) -> tuple:
    """What a prefix's visual tokens are computed from, as tensors for `Prefix.matches`: the features,
    kept indices and, with a `Compressed`, its assignment, merge map (Qwen3-VL's DeepStack follows them)
    and the order in which the LLM receives the rows (`Compressed.order`, None: ascending)."""
    if compressed is None:
        return features, kept, None, None, None, None
    order = getattr(compressed, "order", None)
    mixing = compressed.mixing
    if mixing is None:
        return features, kept, compressed.assignment, None, None, order
    mixing = mixing.to_sparse_coo().coalesce() if mixing.layout != torch.sparse_coo else mixing.coalesce()
    return features, kept, compressed.assignment, mixing.indices(), mixing.values(), order


def _prefix_positions(llm: dict[str, Any], length: int) -> torch.Tensor | None:
    positions = llm.get("position_ids")
    return positions[..., :length].clone() if positions is not None else None


def new_cache(model: Any) -> Any:
    """An empty transformers DynamicCache for `model`."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)



CACHE_RENAMED = "5.24"  # transformers renamed generate's and the models' `past_key_values=` to `cache=`


def with_cache(cache: Any) -> dict[str, Any]:
    """The keyword that hands `cache` to generate() or a model's forward in the installed transformers:
    `cache=` from 5.24 on (`past_key_values=` there is deprecated, with a FutureWarning), else
    `past_key_values=`."""
    if cache is None:
        return {}
    return {_cache_keyword(): cache}



def _cache_keyword() -> str:
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__).release >= Version(CACHE_RENAMED).release else "past_key_values"


def _cut(cache: Any, length: int) -> bool:
    """Cut a DynamicCache back to its first `length` tokens, compacted (False, cache untouched, when a
    layer is not a plain full-attention layer whose cut is exact)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    for layer in layers:
        if layer.is_initialized and layer.keys is not None:
            layer.keys = layer.keys[..., :length, :].clone()
            layer.values = layer.values[..., :length, :].clone()
    return True


class Backbone(Protocol):
    """A Video-LLM adapter: preprocess frames, encode them to visual tokens, generate with a subset kept."""

    name: str
    device: torch.device
    frames_per_group: int  # frames encoded together into one temporal group
    default_frames: int  # frames `ask` samples by default
    grounds: bool  # whether the model is trained to answer with time spans
    official_overrides: dict  # OTTVidConfig.official() overrides that reproduce the authors' code on this model
    method_defaults: dict  # method name -> config options that select its official path on this model
    lmms_sampling: str  # the frames lmms-eval's own model takes (a `Sampling.rule`): what `ottvid eval` takes

    def preprocess(self, frames, timestamps: list[float], duration: float, prompt: str,
                   history: Sequence[tuple[str, str]] = (), source_size: tuple[int, int] | None = None) -> Any:
        """The processor's inputs for the video and `prompt`, after earlier (question, answer) turns;
        `source_size`: the frames' (height, width) as decoded when the decoder resized them (`frame_resize`)."""
        ...

    def frame_resize(self, max_pixels: int | None = None, min_pixels: int | None = None) -> Any:
        """The `video.FrameResize` frames leave the decoder with for this model (its processor's size and
        resampling; Qwen's pixel range where given), or None: frames as decoded."""
        ...

    def encode(self, inputs: Any, saliency: bool = True, watch: Any = None) -> VisualTokens: ...

    def llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                   compressed: Any = None) -> dict[str, Any]:
        """generate() / forward kwargs with only the kept visual tokens (features (M, D) at ascending flat
        indices `kept` (M,)): input_ids, attention_mask, mm_encoder_outputs and, for M-RoPE models,
        position_ids (4, B, L') (row 0 the sequence index 0..L'-1, rows 1-3 the uncompressed M-RoPE
        positions of what was kept; see docs/positions.md). `compressed` (the `Compressed` the
        features came from) lets a model merge its other per-token tensors (Qwen3-VL's DeepStack) the
        same way, with `compressed.apply`; the others ignore it."""
        ...

    def generate(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor, max_new_tokens: int,
                 on_token: Callable[[str], None] | None = None, compressed: Any = None) -> Generated: ...

    def prefill(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                compressed: Any = None) -> int: ...

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
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()  # else "invalid device ordinal" once the weights are moved
        raise ModelError(f"device {device} was asked for but this machine has {count} CUDA GPU"
                         f"{'' if count == 1 else 's'} (cuda:0 to cuda:{count - 1})")
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


def load_processor(model_id: str, video_token_id: int) -> Any:
    """The checkpoint's processor, loaded before its weights so that a missing or broken one is refused
    before the slow part (OSError from transformers when its files are missing). ModelError when its
    tokenizer does not map the processor's video token to the model's `video_token_id` (a folder
    without tokenizer.json gets an empty tokenizer from transformers, which fails only mid-run)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_id)
    token = getattr(processor, "video_token", None)
    if token is not None and processor.tokenizer.convert_tokens_to_ids(token) != video_token_id:
        raise ModelError(f"the tokenizer of {model_id} does not hold the model's video token {token} "
                         f"(tokenizer.json missing, or from another model)")
    return processor


def is_local(model_id: str) -> bool:
    return os.path.isdir(os.path.expanduser(model_id))


class KeptTokenGeneration:
    """generate / prefill / prefill_logits for an adapter that builds its LLM inputs from the kept
    visual tokens with `llm_inputs(inputs, features, kept)` and has `model`, `processor`, `device`."""

    @torch.inference_mode()
    def generate(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor, max_new_tokens: int = 64,
                 on_token: Callable[[str], None] | None = None, compressed: Any = None,
                 prefix: "Prefix | None" = None, keep_prefix: bool = False, prefill: Any = None) -> Generated:
        """Greedy generation from the kept visual tokens; measures prefill (time to first token) and
        decoding. `on_token` receives the reply's new text as each token is generated. `compressed`
        (the `Compressed` the features came from) goes to `llm_inputs` for models that compress more
        than the main features with it (Qwen3-VL's DeepStack).

        Prefix reuse (docs/reuse.md): with `prefix` (a `Prefix` of this video and compression) only
        the tokens after it (the question) are prefilled, from a copy of its KV cache, at the
        positions a full prefill gives them. With `keep_prefix`, the full prefill's KV cache is cut
        back to the prefix after generating and returned as `Generated.prefix` (None if the cache
        cannot be cut exactly). A prefix that does not match this prompt is not used (full prefill).

        `prefill`: a `graphed_prefill.PrefillRunner`, which runs a full prefill padded to a length
        bucket (a CUDA graph per bucket on CUDA) before generate() continues from its KV cache; not
        used with a prefix (only the question is prefilled then) or when the runner stands aside."""
        from ..timing import synchronize

        llm = self._llm_inputs(inputs, features, kept, compressed)
        visual = _visual_key(features, kept, compressed)
        if prefix is not None and not prefix.matches(llm, visual):
            prefix = None
        length = prefix.length if prefix is not None else prefix_length(inputs, llm, self.video_token_id) \
            if keep_prefix else 0
        cache = prefix.copy() if prefix is not None else new_cache(self.model) if keep_prefix else None
        if prefix is not None:
            llm = {k: v for k, v in llm.items() if k != "mm_encoder_outputs"}  # every visual token is in the prefix
        extra = with_cache(cache)
        tokenizer = self.processor.tokenizer
        stream = _TokenStream(self.device, tokenizer, on_token)
        padded = prefill is not None and prefix is None and prefill.active
        start = time.perf_counter()
        if padded:  # the prefill at a bucket length, then generate() from its cropped KV cache
            new, cache = prefill.generate(llm, max_new_tokens, stream, tokenizer.pad_token_id)
        else:
            out = self.model.generate(**llm, **extra, max_new_tokens=max_new_tokens, do_sample=False,
                                      streamer=stream, pad_token_id=tokenizer.pad_token_id)
            new = out[:, llm["input_ids"].shape[1]:]
        synchronize(self.device)
        end = time.perf_counter()
        text = reply_text(tokenizer, new[0].tolist())
        first = stream.first if stream.first is not None else end
        kept_prefix = None
        if keep_prefix and prefix is None and _cut(cache, length):
            kept_prefix = Prefix(cache=cache, length=length, input_ids=llm["input_ids"][:, :length].clone(),
                                 position_ids=_prefix_positions(llm, length), visual=visual)
        return Generated(text=text, llm_input_tokens=int(llm["input_ids"].shape[1]), new_tokens=int(new.shape[1]),
                         prefill_ms=(first - start) * 1e3, generate_ms=(end - first) * 1e3,
                         prefix=prefix if prefix is not None else kept_prefix,
                         prefilled_tokens=int(llm["input_ids"].shape[1]) - (length if prefix is not None else 0),
                         extra={"prefill": dict(prefill.last)} if padded else {})

    @torch.inference_mode()
    def prefill_prefix(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                       compressed: Any = None) -> "Prefix":
        """Prefill only the question-independent prefix (system prompt + video, up to the last video
        token) into a KV cache; `generate(..., prefix=)` then answers any question from it."""
        llm = self._llm_inputs(inputs, features, kept, compressed)
        length = prefix_length(inputs, llm, self.video_token_id)
        head = {k: (v[..., :length] if k == "position_ids" else v[:, :length]) if torch.is_tensor(v) else v
                for k, v in llm.items()}
        cache = new_cache(self.model)
        self.model(**head, **with_cache(cache), use_cache=True, logits_to_keep=1)
        return Prefix(cache=cache, length=length, input_ids=llm["input_ids"][:, :length].clone(),
                      position_ids=_prefix_positions(llm, length), visual=_visual_key(features, kept, compressed))

    @torch.inference_mode()
    def prefill(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                compressed: Any = None) -> int:
        """One prefill forward (KV cache filled, logits for the last position only, as generate()
        does before its first token); returns the LLM input length."""
        llm = self._llm_inputs(inputs, features, kept, compressed)
        self.model(**llm, use_cache=True, logits_to_keep=1)
        return int(llm["input_ids"].shape[1])

    @torch.inference_mode()
    def prefill_logits(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                       compressed: Any = None, prefix: "Prefix | None" = None) -> torch.Tensor:
        """Logits of one forward pass over the (compressed) prompt: (B, L', vocab); with `prefix`,
        over the tokens after it only (B, L' - prefix.length, vocab), from a copy of its KV cache."""
        llm = self._llm_inputs(inputs, features, kept, compressed)
        if prefix is None:
            return self.model(**llm).logits
        if not prefix.matches(llm, _visual_key(features, kept, compressed)):
            raise ValueError("this prefix belongs to another video, compression or system prompt")
        n = prefix.length
        tail = {"input_ids": llm["input_ids"][:, n:], "attention_mask": llm["attention_mask"]}
        if "position_ids" in llm:
            tail["position_ids"] = llm["position_ids"][..., n:]
        return self.model(**tail, **with_cache(prefix.copy()), use_cache=True).logits

    def _llm_inputs(self, inputs: Any, features: torch.Tensor, kept: torch.Tensor,
                    compressed: Any) -> dict[str, Any]:
        return self.llm_inputs(inputs, features, kept, compressed=compressed)

    def reprompt(self, inputs: Any, prompt: str, new_prompt: str, history: Sequence[tuple[str, str]] = (),
                 old_history: Sequence[tuple[str, str]] = ()) -> Any:
        """The processor's inputs for another prompt (and earlier turns) about the same video, built
        from `inputs` (made for `prompt` after `old_history`) without running the processor's video
        path or the encoder: the new chat text is tokenized with the video placeholder unexpanded,
        and the placeholder's expansion (the video tokens, Qwen3-VL's timestamps and markers) is
        copied from `inputs`. The video's tensors are shared; tensors other than the token ids, mask
        and mm_token_type_ids are kept as they are."""
        tokenizer = self.processor.tokenizer
        old = tokenizer(chat_text(self.processor, prompt, old_history), add_special_tokens=False)["input_ids"]
        new = tokenizer(chat_text(self.processor, new_prompt, history), add_special_tokens=False)["input_ids"]
        ids = inputs["input_ids"][0].tolist()
        slot = old.index(self.placeholder_id)
        head = _common_prefix(old, ids, slot)
        tail = _common_prefix(old[::-1], ids[::-1], len(old) - slot - 1)
        replaced = old[head:len(old) - tail]  # the unexpanded text the processor expanded (holds the placeholder)
        expansion = slice(head, len(ids) - tail)
        if new[:head] != old[:head] or new[head:head + len(replaced)] != replaced:
            raise ValueError("the new prompt changes the text before the video: cannot reuse the video's inputs")
        rest = new[head + len(replaced):]
        device = inputs["input_ids"].device
        out = type(inputs)(dict(inputs))
        out.__dict__.update({k: v for k, v in vars(inputs).items() if k != "data"})  # e.g. Qwen3-VL's DeepStack
        row = inputs["input_ids"][0]
        out["input_ids"] = torch.cat([torch.tensor(new[:head], dtype=row.dtype, device=device), row[expansion],
                                      torch.tensor(rest, dtype=row.dtype, device=device)])[None]
        out["attention_mask"] = torch.ones_like(out["input_ids"], dtype=inputs["attention_mask"].dtype)
        if "mm_token_type_ids" in inputs:
            types = inputs["mm_token_type_ids"][0]
            zeros = types.new_zeros
            out["mm_token_type_ids"] = torch.cat([zeros(head), types[expansion], zeros(len(rest))])[None]
        return out

    @property
    def placeholder_id(self) -> int:
        """The chat template's single video placeholder token (the processor expands it)."""
        return self.video_token_id


def reply_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """A reply's text from its generated token ids: special tokens dropped, spaces around it stripped. The one
    rule every engine's reply goes through (`ottvid eval --engine vllm` too), so that equal tokens are equal text."""
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()


def chat_text(processor: Any, prompt: str, history: Sequence[tuple[str, str]] = ()) -> str:
    """The chat-template text of one video and a prompt, after earlier (question, answer) turns: the
    video opens the first user turn. Without history, exactly what every adapter's preprocess renders."""
    turns = [(q, a) for q, a in history] + [(prompt, None)]
    messages: list[dict[str, Any]] = []
    for i, (question, answer) in enumerate(turns):
        content = ([{"type": "video"}] if i == 0 else []) + [{"type": "text", "text": question}]
        messages.append({"role": "user", "content": content})
        if answer is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    while n < limit and n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


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
