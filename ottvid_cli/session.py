"""Many questions about the same videos: a loaded backbone plus the reuse caches (docs/reuse.md).

    engine = Engine(load_backbone("Qwen/Qwen2.5-VL-7B-Instruct"), cache_dir=default_cache_dir())
    first = engine.ask("video.mp4", "What happens?")        # decode, encode, compress, full prefill
    second = engine.ask("video.mp4", "Who is there?")       # cache hit: only the question is prefilled
    second.cache_hit, second.timings_ms["prefill"]
    third = engine.ask("video.mp4", "Who?", Request(compression=Compression(ratio=0.25)))  # recompressed

What is asked (frames, compression, reply length, choices) is one `request.Request`; `Engine.ask` and
`ground` take it, and the per-call plumbing (streaming, stages, history, cancellation) as keywords.

The first question about a video runs the whole pipeline and keeps (1) the prepared video (clip,
the video part of the processor's inputs, visual tokens, compression) in a `cache.PreparedCache`
keyed by the video's content, the sampling and the model, and (2) the KV cache of the prompt's
prefix (system prompt + video). A later question about the same video, sampling and compression
builds only its text inputs and prefills only its own tokens, from a copy of that KV cache, at the
positions a full prefill gives them. Another ratio or method recompresses the cached encoder
output (no decoding or encoding); its prefix is built by its first question.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Sequence

from .backbones.graphed_prefill import prefill_runner
from .cache import DEFAULT_DISK_BYTES, Entry, PreparedCache, compression_key, video_key
from .interrupt import stop_when
from .pipeline import Prepared, RunResult, answer, prepare
from .request import Compression, Request
from .sampling import Sampling
from .tasks import grounding, qa

SERVED = ("decode", "preprocess", "vision", "saliency")  # stages a cache hit does not run


class Engine:
    """A loaded backbone plus the reuse caches; thread-compatible (the server calls it from one worker thread)."""

    def __init__(self, backbone, cache_bytes: int = 2 << 30, cache_dir: str | Path | None = None,
                 keep_saliency: bool = False, disk_bytes: int = DEFAULT_DISK_BYTES, keep_encoded: bool = False,
                 cuda_graphs: bool | None = None):
        """cache_bytes: bound of the in-memory cache (prepared videos, compressions, prefix KV caches);
        cache_dir: also keep encoded videos there (None: memory only), at most `disk_bytes` of them
        (least recently used deleted first); keep_saliency: compute the saliency even for method
        "none", so that any later method recompresses without encoding; keep_encoded: keep the encoder's
        output of a video prepared in chunks with OTT-Vid too (`pipeline.prepare`'s `keep`; without it a long
        video's features are not held, and another ratio or method prepares it again). Warnings about the
        cache (a damaged entry rebuilt, a folder that cannot be written): `engine.cache.take_warnings()`.
        cuda_graphs: run each full prefill padded to a length bucket, as a CUDA graph per bucket on CUDA
        (`backbones.graphed_prefill`); None: on CUDA only; True elsewhere runs the padded prefill eagerly."""
        self.backbone = backbone
        self.prefill = prefill_runner(backbone, cuda_graphs)  # None: generate()'s own prefill
        self.keep_encoded = keep_encoded
        self.pictures: int | None = None  # a video prepared in chunks keeps the frames of a picture this size
        self.cache = PreparedCache(cache_bytes, cache_dir, disk_bytes)
        self.keep_saliency = keep_saliency
        self._lock = threading.RLock()

    def warm_up(self, precompile: bool = True) -> float:
        """One small request through the model (`warmup.warm_up`), outside the caches, so that the
        first real question is not a cold one; returns its time in ms. precompile: also compile every
        compression kernel variant a request may need (for processes that answer many: serve, chat)."""
        from .warmup import warm_up

        with self._lock:
            return warm_up(self.backbone, precompile=precompile, prefill=self.prefill)

    def ask(self, video, question: str, request: Request | None = None, *, on_token=None, on_step=None,
            history: Sequence[tuple[str, str]] = (), cancel=None, video_name: str | None = None) -> RunResult:
        """Answer a question about a video, reusing what the caches hold. `request` (None: every default)
        holds the frames (default: the model's own frame count, 32; 64 for LLaVA-Video), the compression
        (`Compression.config` builds its config for this model), the reply's length (default 64 tokens)
        and multiple-choice options (`choices`: `letter` is the one chosen). `on_token` receives the
        reply's text as it is generated (the result holds the full text either way), `on_step` the name
        of each stage as it starts; `history`: earlier (question, answer) turns, sent before this one;
        `cancel` (a threading.Event, or a callable returning True): once it is set, the run stops at its
        next check (each 1 MiB hashed for the cache key, each packet decoded, each Sinkhorn iteration or
        launch group) with `interrupt.Interrupted`; `video_name`: see `prepared`."""
        request = request or Request()
        if not question.strip():
            raise ValueError("the question is empty")
        if request.point:
            raise ValueError("point is for ground, not ask")
        options = list(request.choices) if request.choices is not None else None
        return self._run("ask", video, qa.build_prompt(question, options), request.sampling or Sampling(),
                         request.compression, request.tokens("ask"), on_token, on_step, options=options,
                         history=history, cancel=cancel, video_name=video_name)

    def ground(self, video, query: str, request: Request | None = None, *, on_token=None, on_step=None,
               cancel=None, video_name: str | None = None) -> RunResult:
        """Find when the described event happens, reusing what the caches hold: `span` is [start, end]
        seconds, or None if the reply holds no span (`span_note` says what it held: no time, or a single
        one). `request` as for `ask`, with `point` (the query names a moment; one time is asked for and
        read as [t, t]); its frames default to 2 fps, at most 768, its reply to 48 tokens. The other
        arguments as for `ask`."""
        request = request or Request()
        if not query.strip():
            raise ValueError("the query is empty")
        if request.choices:
            raise ValueError("choices are for ask, not ground")
        return self._run("ground", video, grounding.build_prompt(query, request.point),
                         request.sampling or Sampling.grounding(), request.compression, request.tokens("ground"),
                         on_token, on_step, point=request.point, cancel=cancel, video_name=video_name)

    def prepared(self, video, sampling: Sampling, method: str, config, prompt: str,
                 on_step: Callable[[str], None] | None = None, cancel=None,
                 video_name: str | None = None, max_visual_tokens: int | None = None
                 ) -> tuple[Prepared, Entry, dict, bool]:
        """(the prepared video for this prompt, its cache entry, the entry's key, whether it was a
        cache hit). A hit builds only the prompt's text inputs and, for a new method or config,
        recompresses the cached encoder output. `cancel`: see `ask`.

        The returned clip's path (what results report) is the video this call named, also on a hit
        on an entry prepared from another file of the same content; a new entry records it too.
        `video_name` replaces it where `video` is a name only this caller can open: `ottvid serve`
        gives the real path of the file it decodes as /proc/self/fd/N, and "" (no file) for an
        upload's temporary file. None: `video` itself (a path; a decoded Video keeps its own)."""
        if video_name is None and isinstance(video, (str, Path)):
            video_name = os.fspath(video)
        key = video_key(self.backbone, video, sampling, cancel)
        ckey = _compression_key(method, config, max_visual_tokens)
        entry = self.cache.get(key, self.backbone)
        needs_saliency = method != "none"
        fresh = entry is None or (needs_saliency and entry.base.visual.saliency is None and not entry.base.streamed)
        if fresh or (ckey not in entry.compressions and entry.base.streamed):  # streamed: no encoder output to reuse
            p = _named(prepare(self.backbone, video, sampling, method, config, prompt=prompt,
                               saliency=True if self.keep_saliency else None, on_step=on_step,
                               keep=self.keep_encoded, max_visual_tokens=max_visual_tokens,
                               pictures=self.pictures), video_name)
            if fresh:
                entry = Entry(base=p, compressions={ckey: p})
                self.cache.put(key, entry)
            else:
                entry.compressions[ckey] = p
                self.cache.resize(key)
            return p, entry, key, False
        p = entry.compressions.get(ckey)
        if p is None:
            if on_step is not None and method != "none":
                on_step("compression")
            p = entry.base.recompress(_fitted(entry.base, method, config, max_visual_tokens), method)
            entry.compressions[ckey] = p
            self.cache.resize(key)
        else:
            p = _served(p, "compression")
        return _named(_served(p).reprompt(prompt), video_name), entry, key, True

    def _run(self, task: str, video, prompt: str, sampling: Sampling, compression: Compression, max_new_tokens: int,
             on_token, on_step, options=None, history=(), point: bool = False, cancel=None,
             video_name: str | None = None) -> RunResult:
        method, max_visual_tokens = compression.method, compression.max_visual_tokens
        config = compression.config(self.backbone)
        with self._lock, stop_when(cancel):  # the long loops check `cancel` too (interrupt.checkpoint)
            prepared, entry, key, hit = self.prepared(video, sampling, method, config, prompt, on_step, cancel,
                                                      video_name, max_visual_tokens)
            source = self.cache.source if hit else None
            if history:
                prepared = prepared.reprompt(prompt, history)
            ckey = _compression_key(method, config, max_visual_tokens)
            prefix = entry.prefixes.get(ckey)
            result = answer(prepared, task, max_new_tokens, on_step, on_token, options=options, prefix=prefix,
                            keep_prefix=prefix is None, cache_hit=hit, point=point, prefill=self.prefill)
            result.cache_source = source
            if prefix is None and result.prefix is not None:
                entry.prefixes[ckey] = result.prefix
                self.cache.resize(key)
            return result


def _compression_key(method: str, config, max_visual_tokens: int | None) -> str:
    """The cache's name of a compression: the method, its config, and the visual tokens asked for at most."""
    key = compression_key(method, config)
    return key if max_visual_tokens is None else f"{key}|max_visual_tokens={int(max_visual_tokens)}"


def _fitted(base: Prepared, method: str, config, max_visual_tokens: int | None):
    """`config` with its ratio lowered to keep at most `max_visual_tokens` of the cached video's visual tokens
    (`chunked.fit_tokens`, which also refuses a prompt longer than the model's context)."""
    from .chunked import fit_tokens

    if method == "none" and max_visual_tokens is None:
        return config
    groups, tokens = base.visual.features.shape[:2]
    text = int(base.inputs["input_ids"].shape[-1]) - groups * tokens
    return fit_tokens(base.backbone, groups, tokens, text, method, config, max_visual_tokens)


def _named(prepared: Prepared, name: str | None) -> Prepared:
    """The prepared video with its clip's path `name` (unchanged for None, or when it is that already)."""
    from dataclasses import replace

    if name is None or prepared.clip.path == name:
        return prepared
    return replace(prepared, clip=replace(prepared.clip, path=name))


def _served(prepared: Prepared, stages: Sequence[str] | str = SERVED) -> Prepared:
    """The prepared video as a cache hit reports it: the stages it did not run take 0 ms (null stays null)."""
    from dataclasses import replace

    stages = (stages,) if isinstance(stages, str) else stages
    timings = {k: (0.0 if k in stages and v is not None else v) for k, v in prepared.timings_ms.items()}
    return replace(prepared, timings_ms=timings)


__all__ = ["Engine"]
