"""Many questions about the same videos: a loaded backbone plus the reuse caches (docs/reuse.md).

    engine = Engine(load_backbone("Qwen/Qwen2.5-VL-7B-Instruct"), cache_dir=default_cache_dir())
    first = engine.ask("video.mp4", "What happens?")        # decode, encode, compress, full prefill
    second = engine.ask("video.mp4", "Who is there?")       # cache hit: only the question is prefilled
    second.cache_hit, second.timings_ms["prefill"]

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

from .cache import DEFAULT_DISK_BYTES, Entry, PreparedCache, compression_key, video_key
from .interrupt import stop_when
from .pipeline import Prepared, RunResult, answer, make_config, prepare
from .sampling import Sampling
from .tasks import grounding, qa

SERVED = ("decode", "preprocess", "vision", "saliency")  # stages a cache hit does not run


class Engine:
    """A loaded backbone plus the reuse caches; thread-compatible (the server calls it from one worker thread)."""

    def __init__(self, backbone, cache_bytes: int = 2 << 30, cache_dir: str | Path | None = None,
                 keep_saliency: bool = False, disk_bytes: int = DEFAULT_DISK_BYTES, keep_encoded: bool = False):
        """cache_bytes: bound of the in-memory cache (prepared videos, compressions, prefix KV caches);
        cache_dir: also keep encoded videos there (None: memory only), at most `disk_bytes` of them
        (least recently used deleted first); keep_saliency: compute the saliency even for method
        "none", so that any later method recompresses without encoding; keep_encoded: keep the encoder's
        output of a video prepared in chunks with OTT-Vid too (`pipeline.prepare`'s `keep`; without it a long
        video's features are not held, and another ratio or method prepares it again). Warnings about the
        cache (a damaged entry rebuilt, a folder that cannot be written): `engine.cache.take_warnings()`."""
        self.backbone = backbone
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
            return warm_up(self.backbone, precompile=precompile)

    def ask(self, video, question: str, options: list[str] | None = None, sampling: Sampling | None = None,
            method: str = "ottvid", ratio: float = 0.1, config=None, preset: str = "paper",
            max_new_tokens: int = 64, on_token=None, on_step=None,
            history: Sequence[tuple[str, str]] = (), cancel=None, video_name: str | None = None,
            max_visual_tokens: int | None = None) -> RunResult:
        """`pipeline.ask` with reuse; `history`: earlier (question, answer) turns, sent before this one;
        `max_visual_tokens`: the ratio is lowered so that at most this many visual tokens reach the LLM;
        `cancel` (a threading.Event, or a callable returning True): once it is set, the run stops at
        its next check (each 1 MiB hashed for the cache key, each packet decoded, each Sinkhorn
        iteration or launch group) with `interrupt.Interrupted`; `video_name`: see `prepared`."""
        if not question.strip():
            raise ValueError("the question is empty")
        return self._run("ask", video, qa.build_prompt(question, options), sampling or Sampling(), method,
                         make_config(ratio, preset, self.backbone, config, method), max_new_tokens, on_token, on_step,
                         options=options, history=history, cancel=cancel, video_name=video_name,
                         max_visual_tokens=max_visual_tokens)

    def ground(self, video, query: str, sampling: Sampling | None = None, method: str = "ottvid",
               ratio: float = 0.1, config=None, preset: str = "paper", max_new_tokens: int = 48,
               on_token=None, on_step=None, point: bool = False, cancel=None,
               video_name: str | None = None, max_visual_tokens: int | None = None) -> RunResult:
        """`pipeline.ground` with reuse (`point`: the query names a moment; `cancel`, `max_visual_tokens` as
        for `ask`; `video_name`: see `prepared`)."""
        if not query.strip():
            raise ValueError("the query is empty")
        return self._run("ground", video, grounding.build_prompt(query, point), sampling or Sampling.grounding(),
                         method, make_config(ratio, preset, self.backbone, config, method), max_new_tokens, on_token,
                         on_step, point=point, cancel=cancel, video_name=video_name,
                         max_visual_tokens=max_visual_tokens)

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

    def _run(self, task: str, video, prompt: str, sampling: Sampling, method: str, config, max_new_tokens: int,
             on_token, on_step, options=None, history=(), point: bool = False, cancel=None,
             video_name: str | None = None, max_visual_tokens: int | None = None) -> RunResult:
        with self._lock, stop_when(cancel):  # the long loops check `cancel` too (interrupt.checkpoint)
            prepared, entry, key, hit = self.prepared(video, sampling, method, config, prompt, on_step, cancel,
                                                      video_name, max_visual_tokens)
            source = self.cache.source if hit else None
            if history:
                prepared = prepared.reprompt(prompt, history)
            ckey = _compression_key(method, config, max_visual_tokens)
            prefix = entry.prefixes.get(ckey)
            result = answer(prepared, task, max_new_tokens, on_step, on_token, options=options, prefix=prefix,
                            keep_prefix=prefix is None, cache_hit=hit, point=point)
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


__all__ = ["Chat", "Engine"]


# ------------------------------------------------------------------------------------------------
# chat: the state of one interactive conversation about a video (the command line does the I/O)

CHAT_HELP = """commands:
  /ratio R         share of visual tokens kept, in (0, 1] (recompresses the cached encoder output)
  /method M        ottvid, none (the uncompressed model) or another method (`ottvid methods` lists them)
  /preset P        paper or official (OTT-Vid's; other methods have none)
  /method-arg K=V  an option of the method (`ottvid methods` lists them; /method clears them)
  /frames N        frames sampled uniformly (a new sampling: decodes and encodes again)
  /fps F           frames a second instead (at most /max-frames, 768 by default; decodes and encodes again)
  /max-frames N    with /fps, at most this many frames
  /tokens N        longest reply, in tokens
  /history on|off  send the earlier questions and answers with each question
  /reset           forget the earlier questions and answers
  /settings        show the settings
  /help            this list
  /quit            leave (so does end of input)"""


class Chat:
    """One conversation about one video over an `Engine`: settings changed by `/name value` commands,
    questions answered with reuse (and, with history on, the earlier turns sent along)."""

    def __init__(self, engine: Engine, video, sampling: Sampling | None = None, ratio: float = 0.1,
                 method: str = "ottvid", preset: str = "paper", max_new_tokens: int = 64, history: bool = False,
                 options: dict | None = None):
        """`options`: the method's options (`method_args.method_options`, as --method-arg gives them)."""
        self.engine, self.video = engine, video
        self.sampling = sampling or Sampling()
        self.ratio, self.method, self.preset = ratio, method, preset
        self.options = dict(options or {})
        self.max_new_tokens = max_new_tokens
        self.history = history
        self.turns: list[tuple[str, str]] = []

    def ask(self, question: str, on_token=None, on_step=None) -> RunResult:
        config = make_config(self.ratio, self.preset, self.engine.backbone, method=self.method,
                             options=self.options) if self.options else None
        result = self.engine.ask(self.video, question, sampling=self.sampling, method=self.method, ratio=self.ratio,
                                 preset=self.preset, config=config, max_new_tokens=self.max_new_tokens,
                                 on_token=on_token, on_step=on_step, history=self.turns if self.history else ())
        self.turns.append((question, result.answer))
        return result

    def settings(self) -> str:
        s = self.sampling
        frames = f"{s.fps:g} fps (at most {s.max_frames})" if s.fps is not None else f"{s.frames or 'default'} frames"
        options = "".join(f" {k}={_text(v)}" for k, v in self.options.items())
        preset = f", preset {self.preset}" if self.method == "ottvid" else ""  # presets are OTT-Vid's alone
        return (f"ratio {self.ratio:g}, method {self.method}{options}{preset}, {frames}, "
                f"replies of at most {self.max_new_tokens} tokens, {self.history_state()}")

    def history_state(self) -> str:
        """'history on (2 earlier turns sent with each question)', 'history off', ..."""
        n = len(self.turns)
        turns = f"{n} earlier turn{'' if n == 1 else 's'}"
        if self.history:
            return f"history on ({turns} sent with each question)" if n else "history on (no earlier turns yet)"
        return f"history off ({turns} kept, not sent; /history on sends them)" if n else "history off"

    def command(self, line: str) -> str | None:
        """Apply one `/command [value]`; returns what to tell the user, or None for /quit. Raises
        ValueError (one line) for an unknown command or a bad value; the settings are then unchanged,
        as they are when KeyboardInterrupt (Ctrl-C) stops the command."""
        saved = (self.ratio, self.method, self.preset, self.options, self.sampling, self.max_new_tokens, self.history)
        try:
            return self._command(line)
        except KeyboardInterrupt:
            (self.ratio, self.method, self.preset, self.options, self.sampling, self.max_new_tokens,
             self.history) = saved
            raise

    def _command(self, line: str) -> str | None:
        from dataclasses import replace

        from .settings import (DEFAULT_MAX_FRAMES, METHODS, PRESETS, SettingsError, check_choice, check_count,
                               check_positive, check_ratio)

        name, _, value = line.strip().partition(" ")
        name, value = name.lower(), value.strip()
        if name in ("/quit", "/exit", "/q"):
            return None
        if name in ("/help", "/?"):
            return CHAT_HELP
        if name == "/settings":
            return self.settings()
        if name == "/reset":
            self.turns.clear()
            return "history cleared"
        saved = (self.ratio, self.method, self.preset, self.options)
        takes = {"/ratio", "/method", "/preset", "/method-arg", "/frames", "/fps", "/max-frames", "/tokens", "/history"}
        if name not in takes:
            raise ValueError(f"unknown command {name} (/help lists them)")
        if not value:  # the setting as it is
            return self._current(name)
        try:
            if name == "/ratio":
                self.ratio = check_ratio(_number(value, float), "/ratio")
            elif name == "/method":
                method = check_choice(value, "/method", METHODS)
                if method != self.method:  # options belong to a method
                    self.method, self.options = method, {}
            elif name == "/method-arg":
                from .method_args import parse_method_args

                try:
                    self.options = {**self.options, **parse_method_args(self.method, [value])}
                except ValueError as exc:  # named as the command it came from
                    raise ValueError(str(exc).replace("--method-arg", "/method-arg", 1)) from None
            elif name == "/preset":
                self.preset = check_choice(value, "/preset", PRESETS)
            elif name == "/frames":
                self.sampling = replace(self.sampling, frames=check_count(_number(value, int), "/frames"), fps=None,
                                        max_frames=None)
            elif name == "/fps":
                self.sampling = replace(self.sampling, frames=None, fps=check_positive(_number(value, float), "/fps"),
                                        max_frames=self.sampling.max_frames or DEFAULT_MAX_FRAMES)
            elif name == "/max-frames":
                if self.sampling.fps is None:
                    raise SettingsError("/max-frames caps /fps sampling: set /fps first")
                self.sampling = replace(self.sampling, max_frames=check_count(_number(value, int), "/max-frames"))
            elif name == "/tokens":
                self.max_new_tokens = check_count(_number(value, int), "/tokens")
            elif name == "/history":
                self.history = check_choice(value.lower(), "/history", ("on", "off")) == "on"
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
        finally:
            if name in ("/ratio", "/method", "/preset", "/method-arg"):
                self._check_compression(saved)
        return self.settings()

    def _current(self, name: str) -> str:
        """`/name` without a value: that setting now, and how to change it."""
        s = self.sampling
        now = {"/ratio": f"ratio {self.ratio:g}", "/method": f"method {self.method}",
               "/preset": f"preset {self.preset}" if self.method == "ottvid"
               else f"method {self.method} has no preset (presets are OTT-Vid's: /method ottvid)",
               "/method-arg": (f"{self.method} options: " + ", ".join(f"{k}={_text(v)}"
                                                                      for k, v in self.options.items())
                               if self.options else f"{self.method} at its defaults"),
               "/frames": (f"{s.frames} frames" if s.frames else "the model's default frame count") if s.fps is None
               else f"sampling by /fps {s.fps:g}",
               "/fps": f"{s.fps:g} frames a second" if s.fps is not None else "/fps is off (frames are counted)",
               "/max-frames": f"at most {s.max_frames} frames" if s.fps is not None else "/max-frames applies with /fps",
               "/tokens": f"replies of at most {self.max_new_tokens} tokens",
               "/history": self.history_state()}[name]
        return f"{now} ({name} VALUE changes it; /help)"

    def _check_compression(self, saved: tuple) -> None:
        """A method, preset and ratio that do not go together are refused here, not at the next question."""
        try:
            make_config(self.ratio, self.preset, self.engine.backbone, method=self.method, options=self.options)
        except ValueError:
            self.ratio, self.method, self.preset, self.options = saved
            raise


def _text(value) -> str:
    """An option's value as --method-arg spells it (true/false, not Python's True/False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
