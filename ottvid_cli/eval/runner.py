"""The eval runner: a benchmark's samples through the model, one record per (sample, method, ratio).

Each video is decoded and encoded once for all of its samples and settings: `prepare()` runs the
vision encoder once (with saliency when a compressing method runs), each (method, ratio) compresses
those tokens once, and each sample's prompt is swapped in by re-tokenising the text only
(`Prepared.reprompt`), never by running the processor's video path or the encoder again; the KV
cache of a setting's video prefix is kept, so later questions about the same video prefill only
their own text.

Records go to a `SampleStore` as soon as they exist, so a killed run loses at most the sample in
flight and a rerun skips what is done. Which frames each sample gets: `FramePlan` (the paper's
protocol, or the command line's overrides). Nothing here prints; progress is a callback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..request import Compression
from ..sampling import Sampling
from ..checks import DEFAULT_MAX_FRAMES
from .benchmarks import GROUNDING, MC, Sample, VideoFinder, VideoRef
from .prefetch import ahead, default_depth
from .prompts import build_prompt, protocol
from .record_files import load_records
from .records import make_record, record_key
from .shards import shard
from .store import SampleStore

Setting = tuple[str, float]  # (method, ratio); ratio 1.0 for "none"
VANILLA = "none"


def settings(methods: Iterable[str], ratios: Iterable[float]) -> list[Setting]:
    """The runs of each sample: vanilla once (ratio 1.0), every other method at every ratio."""
    ratios = list(dict.fromkeys(float(r) for r in ratios))
    out: list[Setting] = []
    for method in dict.fromkeys(methods):
        for ratio in ([1.0] if method == VANILLA else ratios):
            if (method, ratio) not in out:
                out.append((method, ratio))
    return sorted(out, key=lambda s: s[0] != VANILLA)


@dataclass(frozen=True)
class FramePlan:
    """Which frames a sample gets: the benchmark's protocol (32 frames for QA, 2 fps for grounding,
    at most 768) unless `frames` or `fps` is given for every sample; `max_frames` caps both. `rule`:
    which frames a count picks (`Sampling.rule`); None: the one lmms-eval's own model reads for this
    backbone (`for_model`; "linspace" for Qwen, "linspace-floor" for LLaVA), so that a run sees the
    frames the harness's does. Unresolved, `sampling` takes "centre". `max_pixels` / `min_pixels`:
    per frame (Qwen); None: lmms-eval's own model's defaults for the backbone once `for_model`
    resolved them (Qwen2.5-VL: 256 x 28 x 28 to 1605632, which qwen-vl-utils caps at 768 tokens a
    frame), else the backbone's own."""

    frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    max_pixels: int | None = None
    decoder: str = "auto"
    rule: str | None = None
    min_pixels: int | None = None
    keyframes: bool = False  # the key frame nearest each planned one (not the protocol's frames)
    chunk_frames: int | str = "all"  # `Sampling.chunk_frames`: "all" decodes each video whole, ahead of the model

    def __post_init__(self) -> None:
        if self.frames is not None and self.fps is not None:
            raise ValueError("give frames or fps, not both")
        if self.rule is not None:
            Sampling(rule=self.rule)  # ValueError naming the rules

    def for_model(self, backbone: Any) -> "FramePlan":
        """This plan with the backbone's lmms-eval rule and pixel range where none was chosen."""
        pixels = getattr(backbone, "lmms_pixels", None) or {}
        return replace(self, rule=self.rule or getattr(backbone, "lmms_sampling", "centre"),
                       max_pixels=self.max_pixels or pixels.get("max_pixels"),
                       min_pixels=self.min_pixels or pixels.get("min_pixels"))

    def sampling(self, benchmark: str, kind: str) -> Sampling:
        rule = protocol(benchmark, kind)
        frames, fps = (self.frames, None) if self.frames is not None else \
            (None, self.fps) if self.fps is not None else (rule.frames, rule.fps)
        common = {"max_pixels": self.max_pixels, "min_pixels": self.min_pixels, "decoder": self.decoder,
                  "rule": self.rule or "centre", "keyframes": self.keyframes, "chunk_frames": self.chunk_frames}
        if fps is not None:
            return Sampling(fps=fps, max_frames=self.max_frames or DEFAULT_MAX_FRAMES, **common)
        if self.max_frames is not None:
            frames = min(frames, self.max_frames)
        return Sampling(frames=frames, **common)

    def describe(self, benchmark: str, kinds: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The sampling each kind of sample gets, for the run's config."""
        out, lmms = {}, "lmms-eval's for the model"
        for kind in sorted(set(kinds)):
            s = self.sampling(benchmark, kind)
            out[kind] = {"frames": s.frames, "fps": s.fps, "max_frames": s.max_frames, "rule": self.rule or lmms,
                         "pixels": [self.min_pixels, self.max_pixels] if self.max_pixels or self.min_pixels else lmms}
        return out


@dataclass
class Progress:
    """What a progress callback receives after each sample: samples done of `total` in this run."""

    done: int
    total: int
    errors: int
    started: float
    unit: str = "samples"  # what done / total count ("records" for --engine vllm: one per sample and setting)

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None


# ----------------------------------------------------------------------------- one video, many runs

_RUN_ERRORS = (ValueError, OSError, RuntimeError, MemoryError)  # VideoError and EvalError are ValueErrors


def sample_failure(exc: Exception, path: Any = None) -> str:
    """A sample's one-line error: the message, named by type when it is not one of the usual kinds
    (e.g. PyAV's DecoderNotFoundError, a LookupError), and by the video when the message does not say it.
    The error every runner (this one, vllm_runner's) records for a sample that failed."""
    text = " ".join(str(exc).split())
    if not isinstance(exc, _RUN_ERRORS) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if path is not None and str(path) not in text:
        text = f"{path}: {text}"
    return text


class VideoRuns:
    """One decoded and encoded video and every setting's compression of it, reused by all samples
    that ask about it (and, where the backbone can, the KV cache of each setting's video prefix).

    Per setting only what differs between settings runs: its compression (once per video) and the
    LLM's prefill and generation. The prompt's tokens are built once per question for all settings
    (`_text`); the encoder output, saliency and processor inputs are the video's."""

    def __init__(self, backbone: Any, ref: VideoRef, sampling: Sampling, prompt: str, compress: bool,
                 preset: str = "paper", loaded: Any = None, waited_ms: float = 0.0,
                 options: dict[str, dict[str, Any]] | None = None):
        """`loaded`: the video already decoded and preprocessed with `prompt` (`load_video`, perhaps in
        the background; else it is loaded here); `waited_ms`: how long the runner waited for it;
        `options`: {method: its options} as `method_args.method_options` returns them (else defaults)."""
        from ..pipeline import prepare

        started = time.perf_counter()
        self.backbone, self.preset, self.options = backbone, preset, dict(options or {})
        loaded = loaded if loaded is not None else load_video(backbone, ref, sampling, prompt)
        if isinstance(loaded, Path):  # prepared from the file, chunk by chunk where it is long (`load_video`)
            self.base = prepare(backbone, loaded, sampling, VANILLA, prompt=prompt, saliency=compress, keep=True)
        else:
            self.base = prepare(backbone, loaded, method=VANILLA, saliency=compress)
        self.prepared: dict[Setting, Any] = {}
        self.prefixes: dict[Setting, Any] = {}
        self.answered = 0
        # the wall time of this video's shared work in the run: waiting for its decode + preprocess (which
        # overlap the previous video's model work when prefetched), the encoder (+ saliency)
        self.shared_ms = waited_ms + (time.perf_counter() - started) * 1e3
        self._texts: tuple[str, Any] = (prompt, self.base)  # the last prompt and the base Prepared holding its tokens

    def setting(self, method: str, ratio: float) -> Any:
        key = (method, ratio)
        if key not in self.prepared:
            compression = Compression(method, ratio, self.preset, self.options.get(method) or {})
            self.prepared[key] = self.base if method == VANILLA else \
                self.base.recompress(compression.config(self.backbone), method)
        return self.prepared[key]

    def _text(self, prompt: str) -> Any:
        """The base Prepared with `prompt`'s tokens (`Prepared.reprompt`), tokenised once for every setting."""
        if self._texts[0] != prompt:
            self._texts = (prompt, self.base.reprompt(prompt))
        return self._texts[1]

    def reply(self, prompt: str, method: str, ratio: float, max_new_tokens: int,
              keep_prefix: bool = True) -> tuple[Any, Any]:
        """Greedy reply to `prompt` about this video with (method, ratio): (Prepared, pipeline.RunResult).
        The prompt replaces the text only (`Prepared.reprompt`, shared by the settings); the KV cache of
        the video prefix kept by this setting's first reply serves the later ones (`keep_prefix=False`:
        no later question will come, so none is kept)."""
        from ..pipeline import answer

        text = self._text(prompt)
        prepared = replace(self.setting(method, ratio), prompt=text.prompt, inputs=text.inputs, history=text.history)
        key = (method, ratio)
        prefix = self.prefixes.get(key)
        result = answer(prepared, "ask", max_new_tokens, prefix=prefix, keep_prefix=keep_prefix and prefix is None)
        if result.prefix is not None and keep_prefix:
            self.prefixes[key] = result.prefix
        return prepared, result

    def answer(self, sample: Sample, prompt: str, method: str, ratio: float, max_new_tokens: int,
               keep_prefix: bool = True) -> dict:
        """The scored record of `sample` (asked with `prompt`) with (method, ratio). Its `wall_ms` holds
        the wall time of this record's own work (`own`: the setting's compression on its first use, the
        prefill and generation) and, on the video's first record, of the shared decode and encode (`shared`)."""
        started = time.perf_counter()
        prepared, result = self.reply(prompt, method, ratio, max_new_tokens, keep_prefix)
        own = (time.perf_counter() - started) * 1e3
        shared = self.answered > 0
        self.answered += 1
        frames = {k: prepared.frames[k] for k in ("requested", "count", "fps", "max_frames", "rule", "notes")}
        record = make_record(sample, method, ratio, result.answer, prompt=prompt, video=prepared.clip.path,
                             duration=prepared.clip.duration, tokens=result.tokens, timings_ms=result.timings_ms)
        record["frames"] = frames
        record["reused"] = shared  # the encoding was made for an earlier record: its timings are that one's
        record["wall_ms"] = {"shared": 0.0 if shared else round(self.shared_ms, 3), "own": round(own, 3)}
        return record


# ----------------------------------------------------------------------------- the runner


@dataclass
class RunStats:
    """What one call of `run` did: samples run, records written, error records among them."""

    samples: int = 0
    records: int = 0
    errors: int = 0
    seconds: float = 0.0


def load_video(backbone: Any, ref: VideoRef | None, sampling: Sampling | None, prompt: str) -> Any:
    """The video decoded (its part [start, end] only) and preprocessed with `prompt`: a
    `pipeline.Loaded` (None for a missing video). Runs in a background thread when the runner
    prefetches; raises what decoding raises (video.VideoError, ...). With `sampling.chunk_frames` other than
    "all", a whole video (no part, no frame rate) is not loaded here: its path comes back, and `VideoRuns`
    prepares it from the file, chunk by chunk where its sample is longer than a chunk."""
    from ..pipeline import load

    if ref is None:
        return None
    if sampling is not None and sampling.chunk_frames != "all" and ref.start is None and ref.end is None \
            and ref.frame_rate is None:  # decoded by `VideoRuns` a chunk ahead of the encoder, not whole ahead
        return Path(ref.path)
    return load(backbone, ref.path, sampling, prompt, start=ref.start, end=ref.end, frame_rate=ref.frame_rate)


def groups_by_video(todo: Sequence[tuple[Sample, list[Setting]]], finder: VideoFinder, frames: FramePlan
                    ) -> list[tuple[VideoRef | None, Sampling | None, list[tuple[Sample, list[Setting]]]]]:
    """The samples to run grouped by (video, part of it, sampling), in order of first appearance;
    samples whose video is missing come one per group with ref None."""
    groups: dict[Any, tuple[VideoRef | None, Sampling | None, list]] = {}
    for n, (sample, runs) in enumerate(todo):
        ref = finder.find(sample)
        if ref is None:
            groups[("missing", n)] = (None, None, [(sample, runs)])
            continue
        sampling = frames.sampling(sample.benchmark, sample.kind)
        key = (str(ref.path), ref.start, ref.end, ref.frame_rate, sampling)
        groups.setdefault(key, (ref, sampling, []))[2].append((sample, runs))
    return list(groups.values())


def run(backbone: Any, samples: Sequence[Sample], out: Path | str, runs: Sequence[Setting], videos: Path | str,
        frames: FramePlan | None = None, *, rank: int = 0, shards: int = 1, preset: str = "paper",
        retry_errors: bool = False, on_progress: Callable[[Progress], None] | None = None,
        max_new_tokens: int | None = None, prefetch: int | None = None) -> RunStats:
    """Run shard `rank` of `shards` of `samples` with every (method, ratio) in `runs`, appending the
    records to OUT (see store.py); what is done already is skipped. A sample whose video is missing
    or cannot be decoded, or whose run fails (any Exception), is recorded with its error and the run
    goes on; a record that cannot be written (errors.StoreError) and Ctrl-C stop it, keeping what was written.
    `max_new_tokens` overrides the protocol's reply budget (for measurements only: benchmarks/eval_sweep.py).
    `prefetch`: how many of the next videos are decoded and preprocessed in background threads while
    the model works on the current one (0: each when it is reached; None: `prefetch.default_depth`)."""
    frames = (frames or FramePlan()).for_model(backbone)
    if prefetch is None:
        prefetch = default_depth(backbone.device)
    finder = VideoFinder(videos)
    stats = RunStats()
    started = time.perf_counter()
    compress = any(m != VANILLA for m, _ in runs)
    with SampleStore(out, rank=rank, shards=shards, retry_errors=retry_errors) as store:
        todo = store.todo(shard(samples, rank, shards), runs)
        progress = Progress(done=0, total=len(todo), errors=0, started=started)
        if on_progress is not None:
            on_progress(progress)

        def write(record: dict) -> None:
            record["engine"] = "ottvid"
            if store.add(record):
                stats.records += 1
                if record.get("error") is not None:
                    stats.errors += 1
                    progress.errors += 1

        groups = ahead(groups_by_video(todo, finder, frames),
                       lambda group: load_video(backbone, group[0], group[1], build_prompt(group[2][0][0])), prefetch)
        try:
            while True:
                asked = time.perf_counter()
                try:
                    (ref, sampling, items), loaded, error = next(groups)
                except StopIteration:
                    break
                waited = (time.perf_counter() - asked) * 1e3
                video: VideoRuns | None = None
                failure: BaseException | str | None = None
                if ref is None:
                    failure = f"video not found under {finder.root}: {items[0][0].video}"
                else:
                    try:
                        if error is not None:
                            raise error
                        video = VideoRuns(backbone, ref, sampling, build_prompt(items[0][0]), compress, preset,
                                          loaded, waited)
                    except Exception as exc:  # any failure of this video (not Ctrl-C): recorded, the run goes on
                        failure = sample_failure(exc, ref.path)
                    del loaded
                for n, (sample, left) in enumerate(items):
                    prompt = build_prompt(sample)
                    budget = max_new_tokens or protocol(sample.benchmark, sample.kind).max_new_tokens
                    later = n + 1 < len(items)  # another question about this video follows: keep the video's KV prefix
                    for method, ratio in left:
                        if video is None:
                            record = make_record(sample, method, ratio, error=failure, prompt=prompt,
                                                 video=ref.path if ref is not None else None)
                        else:
                            try:
                                record = video.answer(sample, prompt, method, ratio, budget, keep_prefix=later)
                            except Exception as exc:
                                record = make_record(sample, method, ratio, error=sample_failure(exc), prompt=prompt,
                                                     video=ref.path)
                        write(record)  # outside the try: a failed write (StoreError) stops the run
                    stats.samples += 1
                    progress.done += 1
                    if on_progress is not None:
                        on_progress(progress)
                del video
        finally:
            groups.close()  # the loads not started are dropped
    stats.seconds = time.perf_counter() - started
    return stats


def remaining(out: Path | str, samples: Sequence[Sample], runs: Sequence[Setting]) -> int:
    """How many (sample, method, ratio) records of the whole run no record file of OUT holds yet."""
    done = {record_key(r["id"], r["method"], r["ratio"]) for r in load_records(out)}
    return sum(1 for s in samples for m, r in runs if record_key(s.id, m, r) not in done)


def kinds(samples: Iterable[Sample]) -> list[str]:
    return sorted({s.kind for s in samples}, key=[MC, GROUNDING].index)
