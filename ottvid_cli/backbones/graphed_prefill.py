"""The prefill padded to a length bucket, replayed as one CUDA graph per bucket on CUDA (docs/gpu.md,
"The prefill as a CUDA graph").

A prefill at 10% is host-bound: transformers' Python issues over a thousand launches for a few hundred
tokens. A CUDA graph replays them at once, but it is made for fixed shapes and fixed buffers, so:

- the multimodal model's own code embeds the prompt (the visual features placed, Qwen's positions,
  Qwen3-VL's DeepStack), outside the graph (`language_inputs`: its language model's inputs, taken by
  a forward pre-hook that stops the call there; the merge does host reads a graph cannot hold);
- the embeddings are padded at the end with zeros to a bucket length (`bucket`: padding below 10% of
  the length, or below 16 tokens for short prompts), the positions continued past the last (`pad`);
  causal attention keeps the padding from touching the real rows;
- the language model and the LM head on the last real position run inside (`padded_forward`), with
  Qwen3-VL's DeepStack added by forward hooks on its first layers as dense (B, P, D) tensors, zero off
  the visual rows (the same sums as transformers' masked add, without its host read);
- the KV cache is cropped to the real length into a fresh DynamicCache (`crop`), from which
  `continue_generation` lets `generate()` produce the rest of the reply after the first token.

`PrefillRunner` holds one graph per bucket on CUDA, captured lazily (the engine's warm-up captures the
default request's); elsewhere it runs the same padded code eagerly, which is how the tests drive it on
the CPU. Nothing here prints.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .base import new_cache, with_cache

ALIGN = 16  # buckets are multiples of this many tokens
GROWTH = 1.1  # each bucket at most this factor above the previous one: padding < 10% of the length
MAX_GRAPHS = 8  # graphs kept at once (each holds its own memory pool); the least recently used goes first
# generation options that add a logits processor to greedy decoding; only repetition_penalty is
# applied to the first token here, so a model whose generation config sets another one is not padded
UNSUPPORTED = ("guidance_scale", "sequence_bias", "encoder_repetition_penalty", "no_repeat_ngram_size",
               "encoder_no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens",
               "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
               "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
               "watermarking_config")


def bucket(length: int, align: int = ALIGN, growth: float = GROWTH) -> int:
    """The padded length a prompt of `length` tokens runs at: the smallest bucket >= length.

    The buckets are `align`, then each the larger of (previous + align) and previous * growth rounded
    down to a multiple of `align`; so the padding is below `align` tokens where buckets are `align`
    apart (short prompts) and below (growth - 1) x length above."""
    if length < 1:
        raise ValueError(f"a prompt of {length} tokens has no bucket")
    if align < 1 or growth <= 1:
        raise ValueError("buckets need align >= 1 and growth > 1")
    size = align
    while size < length:
        size = _next(size, align, growth)
    return size


def _next(size: int, align: int, growth: float) -> int:
    return max(size + align, int(size * growth) // align * align)


@dataclass
class Padded:
    """A prompt's language-model inputs padded to a bucket: embeds (B, P, D); positions (R, B, P) or
    (B, P); last (1,) the index of the last real position; deepstack (k, B, P, D) or None; length the
    real length."""

    embeds: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor
    deepstack: torch.Tensor | None
    length: int

    def key(self) -> tuple:
        """What a graph is specialised to: every tensor's shape and dtype."""
        tensors = (self.embeds, self.positions, self.deepstack)
        return tuple((tuple(t.shape), t.dtype) if t is not None else None for t in tensors)

    def copy_into(self, other: "Padded") -> None:
        """Write this prompt's values into `other`'s tensors (a graph's inputs, of the same key)."""
        other.embeds.copy_(self.embeds)
        other.positions.copy_(self.positions)
        other.last.copy_(self.last)
        if self.deepstack is not None:
            other.deepstack.copy_(self.deepstack)
        other.length = self.length

    def clone(self) -> "Padded":
        return Padded(self.embeds.clone(), self.positions.clone(), self.last.clone(),
                      self.deepstack.clone() if self.deepstack is not None else None, self.length)


class _Taken(Exception):
    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("language model inputs taken")
        self.kwargs = kwargs


def language_inputs(model: Any, llm: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the multimodal `model` gives its language model for the forward kwargs
    `llm` (a backbone's `llm_inputs`): inputs_embeds with the visual features placed, position_ids
    (None: the sequence index) and, on Qwen3-VL, visual_pos_masks and deepstack_visual_embeds. Taken
    by a forward pre-hook that stops the call before the language model runs."""

    def take(module, args, kwargs):
        raise _Taken(dict(kwargs))

    handle = model.model.language_model.register_forward_pre_hook(take, with_kwargs=True)
    try:
        model.model(**llm, use_cache=False)
    except _Taken as taken:
        return taken.kwargs
    finally:
        handle.remove()
    raise RuntimeError("the model did not call its language model")


def pad(inputs: dict[str, Any], size: int) -> Padded:
    """`language_inputs` padded at the end to `size` positions: zero embeddings; each position row
    continued at its last value + 1, + 2, ...; DeepStack as dense (k, B, size, D) tensors, zero off
    the visual rows. Padding after the real tokens cannot change them (causal attention)."""
    embeds = inputs["inputs_embeds"]
    batch, length, width = embeds.shape
    if size < length:
        raise ValueError(f"cannot pad {length} tokens to {size}")
    extra = size - length
    padded = torch.cat([embeds, embeds.new_zeros(batch, extra, width)], 1)
    positions = inputs.get("position_ids")
    if positions is None:
        positions = torch.arange(length, device=embeds.device).expand(batch, length)
    steps = torch.arange(1, extra + 1, device=positions.device, dtype=positions.dtype)
    positions = torch.cat([positions, positions[..., -1:] + steps], -1)
    last = torch.tensor([length - 1], device=embeds.device)
    deepstack = None
    layers = inputs.get("deepstack_visual_embeds")
    if layers:
        mask = inputs["visual_pos_masks"].to(embeds.device)
        deepstack = embeds.new_zeros(len(layers), batch, size, width)
        for i, layer in enumerate(layers):
            deepstack[i, :, :length][mask] = layer.to(embeds.device, embeds.dtype)
    return Padded(padded, positions, last, deepstack, length)


def padded_forward(model: Any, padded: Padded) -> tuple[torch.Tensor, Any]:
    """The language model over the padded inputs into a new DynamicCache, and the LM head on the last
    real position: (logits (B, 1, vocab), the cache holding all P positions). What a graph captures."""
    language = model.model.language_model
    cache = new_cache(model)
    hooks = []
    if padded.deepstack is not None:  # transformers adds DeepStack after each of the first k layers
        for i, added in enumerate(padded.deepstack):
            hooks.append(language.layers[i].register_forward_hook(
                lambda module, args, output, added=added: output + added))
    try:
        out = language(inputs_embeds=padded.embeds, position_ids=padded.positions, attention_mask=None,
                       use_cache=True, **with_cache(cache))
    finally:
        for hook in hooks:
            hook.remove()
    hidden = out.last_hidden_state.index_select(1, padded.last)
    return model.lm_head(hidden), cache


def crop(model: Any, cache: Any, length: int) -> Any:
    """A new DynamicCache holding the first `length` positions of every layer of `cache` (copies: a
    graph's cache is overwritten by its next replay)."""
    cropped = new_cache(model)
    for index, layer in enumerate(cache.layers):
        cropped.update(layer.keys[..., :length, :], layer.values[..., :length, :], index)
    return cropped


def plain_layers(model: Any) -> bool:
    """Whether every layer of `model`'s DynamicCache is a plain full-attention one (a sliding window
    layer keeps only its window of a padded prompt, so its crop would not be the real prompt's)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(new_cache(model), "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def unsupported_generation(model: Any) -> str | None:
    """The first option of `model`'s generation config that adds a logits processor other than the
    repetition penalty to greedy decoding (None: none does)."""
    config = model.generation_config
    for name in UNSUPPORTED:
        value = getattr(config, name, None)
        if value not in (None, 0, 1, 1.0, False, [], ()):
            return name
    return None


def first_token(model: Any, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The greedy first token (B, 1) from the last position's logits (B, vocab), after the repetition
    penalty of the model's generation config, as generate() picks it."""
    scores = logits.to(dtype=torch.float32)
    penalty = getattr(model.generation_config, "repetition_penalty", None)
    if penalty is not None and penalty != 1.0:
        from transformers import RepetitionPenaltyLogitsProcessor

        scores = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, scores)
    return scores.argmax(-1, keepdim=True)


class _AfterPrompt:
    """A generate() streamer that hands on to `stream` every call but the first (the prompt, which
    `continue_generation` has already given it, with the first token)."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.calls = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:
            self.stream.put(value)

    def end(self) -> None:
        self.stream.end()


def continue_generation(model: Any, llm: dict[str, Any], logits: torch.Tensor, cache: Any, max_new_tokens: int,
                        stream: Any, pad_token_id: int | None) -> torch.Tensor:
    """The reply's token ids (B, n) after a prefill made outside generate(): the first token from
    `logits` (B, vocab) of the last prompt position, then greedy generate() continuing from `cache`
    (the prompt's KV cache, which grows by the tokens generated) for the rest. `stream` (a generate()
    streamer) gets the prompt, then each token, as from generate()."""
    ids = llm["input_ids"]
    first = first_token(model, ids, logits)
    stream.put(ids.cpu())
    stream.put(first.cpu())
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    if max_new_tokens <= 1 or (ids.shape[0] == 1 and int(first[0, 0]) in eos):
        stream.end()
        return first
    extended = {"input_ids": torch.cat([ids, first], 1),
                "attention_mask": torch.cat([llm["attention_mask"], llm["attention_mask"][:, -1:]], 1)}
    positions = llm.get("position_ids")
    if positions is not None:  # the first token continues every row at its last value + 1, as generate() does
        extended["position_ids"] = torch.cat([positions, positions[..., -1:] + 1], -1)
    out = model.generate(**extended, **with_cache(cache), max_new_tokens=max_new_tokens - 1, do_sample=False,
                         streamer=_AfterPrompt(stream), pad_token_id=pad_token_id)
    return out[:, ids.shape[1]:]


@dataclass
class _Graph:
    graph: Any
    inputs: Padded
    logits: torch.Tensor
    cache: Any


# A captured graph replays the eager kernels, so its logits equal the eager ones; this bound (relative to the
# largest logit) only tells a graph that computes something else from rounding, checked once per capture.
REPLAY_TOLERANCE = 1e-2


class PrefillRunner:
    """The prefill of full prompts at bucket lengths: on CUDA with `graphs`, one torch.cuda.CUDAGraph
    per bucket (captured on first use, at most `max_graphs` kept); otherwise the same padded forward
    run eagerly. `reason` says why it stands aside (None: in use); `last` what the last call did."""

    def __init__(self, model: Any, graphs: bool = True, align: int = ALIGN, growth: float = GROWTH,
                 max_graphs: int = MAX_GRAPHS):
        self.model = model
        self.graphs = bool(graphs) and model.device.type == "cuda"
        self.align, self.growth, self.max_graphs = align, growth, max_graphs
        self.captured: OrderedDict[tuple, _Graph] = OrderedDict()
        self.last: dict[str, Any] = {}
        option = unsupported_generation(model)
        self.reason: str | None = (f"the generation config sets {option}" if option is not None else
                                   None if plain_layers(model) else "the KV cache has sliding-window layers")

    @property
    def active(self) -> bool:
        return self.reason is None

    @torch.inference_mode()
    def __call__(self, llm: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """(logits (B, vocab) of the last real position, the KV cache of the real positions as a
        DynamicCache) of a full prefill of the forward kwargs `llm`."""
        padded = pad(language_inputs(self.model, llm), bucket(int(llm["input_ids"].shape[1]), self.align,
                                                                  self.growth))
        size = int(padded.embeds.shape[1])
        if self.graphs:
            try:
                logits, cache = self._replay(padded)
            except RuntimeError as error:  # a model whose forward a graph cannot hold: eager from now on
                self.graphs = False
                self.captured.clear()
                self.reason = f"CUDA graph capture failed: {str(error).splitlines()[0][:200]}"
            else:
                self.last = {"path": "cuda_graph", "bucket": size, "tokens": padded.length}
                return logits, cache
        logits, cache = padded_forward(self.model, padded)
        self.last = {"path": "padded", "bucket": size, "tokens": padded.length}
        return logits[:, 0], crop(self.model, cache, padded.length)

    def generate(self, llm: dict[str, Any], max_new_tokens: int, stream: Any,
                 pad_token_id: int | None) -> tuple[torch.Tensor, Any]:
        """A full prefill of `llm` at its bucket, then `continue_generation`: (the reply's token ids
        (B, n), the KV cache of the prompt and the reply, a DynamicCache)."""
        logits, cache = self(llm)
        return continue_generation(self.model, llm, logits, cache, max_new_tokens, stream, pad_token_id), cache

    def capture(self, padded: Padded) -> None:
        """Capture the graph of `padded`'s bucket (three eager runs on a side stream first, as CUDA graphs need)."""
        key = padded.key()
        if key in self.captured:
            return
        while len(self.captured) >= self.max_graphs:
            self.captured.popitem(last=False)
        inputs = padded.clone()
        side = torch.cuda.Stream(device=inputs.embeds.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager, _ = padded_forward(self.model, inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits, cache = padded_forward(self.model, inputs)
        graph.replay()  # once against the eager run: a graph that computes something else is never used
        gap = float((logits.float() - eager.float()).abs().max())
        if not gap <= REPLAY_TOLERANCE * max(float(eager.float().abs().max()), 1.0):
            raise RuntimeError(f"the captured graph's logits differ from the eager forward's by {gap:.3g}")
        self.captured[key] = _Graph(graph, inputs, logits, cache)

    def _replay(self, padded: Padded) -> tuple[torch.Tensor, Any]:
        key = padded.key()
        self.capture(padded)
        held = self.captured[key]
        self.captured.move_to_end(key)
        padded.copy_into(held.inputs)
        held.graph.replay()
        return held.logits[:, 0].clone(), crop(self.model, held.cache, padded.length)


def prefill_runner(backbone: Any, cuda_graphs: bool | None = None) -> PrefillRunner | None:
    """The runner an engine hands to generation: `cuda_graphs` None (the default) means on CUDA only;
    True on another device runs the padded prefill eagerly (what the tests use); False: none."""
    model = getattr(backbone, "model", None)
    if model is None or not hasattr(model, "lm_head"):
        return None
    on = backbone.device.type == "cuda" if cuda_graphs is None else cuda_graphs
    return PrefillRunner(model, graphs=True) if on else None


def bucket_count(limit: int, align: int = ALIGN, growth: float = GROWTH) -> int:
    """How many buckets cover prompts of 1 to `limit` tokens (the most graphs a model could need)."""
    count, size = 1, align
    while size < limit:
        size = _next(size, align, growth)
        count += 1
    return count


__all__ = ["ALIGN", "GROWTH", "Padded", "PrefillRunner", "bucket", "bucket_count", "continue_generation", "crop",
           "first_token", "language_inputs", "pad", "padded_forward", "prefill_runner"]
