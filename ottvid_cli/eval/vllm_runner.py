"""`ottvid eval --engine vllm`: the benchmark protocol driving vLLM, one in-process engine per setting.

Everything but the model is the ottvid engine's (runner.py): the samples of the shard and what the store
says is left, the frames (`FramePlan`: decoded, sampled and resized by ottvid, handed to vLLM as arrays with
their metadata, so vLLM decodes and resizes nothing), the chat text, the reply budget, the parser, the
metric and the records. What differs is who answers: per (method, ratio) one `vllm.LLM` with the plugin's
method at q = 1 - ratio (`integrations.vllm.offline`), started once, given every pending sample in chunks
of `chunk` requests that vLLM batches, while background threads decode the next videos; a chunk's records
are written as soon as it ends, so an interrupted run loses at most the chunk in flight and resumes.

A video that cannot be decoded, or a request vLLM refuses (e.g. longer than max_model_len), is an error
record and the run goes on; an engine that cannot start stops the run (`EngineStartError`, one line).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .benchmarks import Sample, VideoFinder
from .prefetch import ahead
from .prompts import build_prompt, protocol
from .records import make_record
from .runner import FramePlan, Progress, RunStats, Setting, groups_by_video, sample_failure
from .shards import shard
from .store import SampleStore

ENGINE = "vllm"


class EngineStartError(RuntimeError):
    """vLLM could not start the engine of a setting; the message is one line. Records written are kept."""


@dataclass(frozen=True)
class VllmOptions:
    """How the engines run: `tensor_parallel_size` GPUs each, `engine_args` (--engine-arg: any other
    `vllm.LLM` argument, e.g. max_model_len, gpu_memory_utilization), `dtype` (None: vLLM's choice) and
    `chunk`: the requests handed to vLLM at once (memory stays bounded: a chunk's frames and its replies)."""

    tensor_parallel_size: int = 1
    engine_args: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    chunk: int = 64


@dataclass
class _Pending:
    sample: Sample
    prompt: str
    request: int  # its place in the chunk's queue
    video: Any  # the path decoded
    duration: float
    frames: dict[str, Any]
    decode_ms: float | None


def _keep_numba_out() -> None:
    """vLLM's CPU workers fail to start in a process that imported numba (vLLM 0.32,
    vllm/triton_utils/dispatcher.py, `_rebind_kernels`: `vars()` of llvmlite's `ffi.lib` is no dict), and
    every setting starts an engine after the previous one's videos were resized: on the CPU torch resizes
    (`video.bicubic_kernel.refuse`). Raises EngineStartError where numba is in already."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM here (an engine of the caller's own, `make_engine`)
        return
    from ..video import bicubic_kernel

    if current_platform.is_cpu() and not bicubic_kernel.refuse("vLLM's CPU workers cannot start after numba"):
        raise EngineStartError("vLLM's CPU workers cannot start in a process that has imported numba (vLLM "
                               "0.32's _rebind_kernels); run the evaluation in a process of its own")


def _decoded(adapter: Any, group: tuple) -> tuple[Any, Any, dict[str, Any], float]:
    """A group's video as vLLM is handed it: (clip, frames (n, h, w, 3) uint8, metadata, decode ms); the
    frames ottvid's engine preprocesses (`Qwen25VL.video_frames`), padded and at the frame size."""
    from ..prepared import PREPROCESS_LOCK, frame_resize, pixel_range

    ref, sampling, _ = group
    started = time.perf_counter()
    clip = sampling.decode(ref.path, adapter.default_frames, ref.start, ref.end, frame_rate=ref.frame_rate,
                           resize=frame_resize(adapter, sampling))
    with PREPROCESS_LOCK, pixel_range(adapter, sampling):
        video = adapter.video_frames(clip.frames, clip.source_size)
    frames = video.permute(0, 2, 3, 1).contiguous().numpy()
    metadata = adapter.video_metadata(clip.timestamps, clip.duration, frames.shape[0])
    return clip, frames, metadata, (time.perf_counter() - started) * 1e3


def run_vllm(model: str, samples: Sequence[Sample], out: Path | str, runs: Sequence[Setting], videos: Path | str,
             frames: FramePlan | None = None, *, options: VllmOptions | None = None, rank: int = 0, shards: int = 1,
             preset: str = "paper", retry_errors: bool = False,
             on_progress: Callable[[Progress], None] | None = None, max_new_tokens: int | None = None,
             prefetch: int | None = None, make_engine: Callable[[dict[str, Any]], Any] | None = None) -> RunStats:
    """Run shard `rank` of `shards` of `samples` with every (method, ratio) in `runs` through vLLM, appending
    the records (each with "engine": "vllm") to OUT as `runner.run` does; what is done already is skipped.
    `prefetch`: videos decoded ahead in background threads (None: 2). `make_engine(kwargs)`: the engine of
    a setting (default `offline.OfflineEngine`). Raises EngineStartError when an engine cannot start,
    errors.StoreError when a record cannot be written; KeyboardInterrupt passes (the records are kept)."""
    from ..backbones import frames_only
    from ..integrations.vllm.offline import OfflineEngine, engine_arguments

    options = options or VllmOptions()
    _keep_numba_out()
    make_engine = make_engine or OfflineEngine
    adapter = frames_only(model)
    frames = (frames or FramePlan()).for_model(adapter)
    finder = VideoFinder(videos)
    stats = RunStats()
    started = time.perf_counter()
    with SampleStore(out, rank=rank, shards=shards, retry_errors=retry_errors) as store:
        todo = store.todo(shard(samples, rank, shards), runs)
        progress = Progress(done=0, total=sum(len(left) for _, left in todo), errors=0, started=started,
                            unit="records")
        if on_progress is not None:
            on_progress(progress)

        def write(record: dict) -> None:
            record["engine"] = ENGINE
            if store.add(record):
                stats.records += 1
                if record.get("error") is not None:
                    stats.errors += 1
                    progress.errors += 1
            progress.done += 1
            if on_progress is not None:
                on_progress(progress)

        for method, ratio in runs:
            mine = [(sample, [(method, ratio)]) for sample, left in todo if (method, ratio) in left]
            if not mine:
                continue
            kwargs = engine_arguments(model, method, ratio, preset=preset,
                                      tensor_parallel_size=options.tensor_parallel_size, dtype=options.dtype,
                                      extra=options.engine_args)
            try:
                engine = make_engine(kwargs)
            except (ValueError, RuntimeError, OSError) as exc:  # vLLM's refusals of a configuration, a failed start
                raise EngineStartError(f"vLLM could not start the engine for {_setting(method, ratio)}: "
                                       f"{sample_failure(exc)}") from None
            try:
                _run_setting(engine, adapter, mine, finder, frames, method, ratio, write, options.chunk,
                             max_new_tokens, 2 if prefetch is None else prefetch)
            finally:
                engine.close()
            stats.samples = max(stats.samples, len(mine))
    stats.seconds = time.perf_counter() - started
    return stats


def _run_setting(engine: Any, adapter: Any, todo: list, finder: VideoFinder, frames: FramePlan, method: str,
                 ratio: float, write: Callable[[dict], None], chunk: int, max_new_tokens: int | None,
                 prefetch: int) -> None:
    """One setting's samples through its engine, `chunk` requests at a time."""
    from ..backbones.base import chat_text, reply_text

    pending: list[_Pending] = []

    def flush() -> None:
        if not pending:
            return
        replies = engine.finish()
        if len(replies) != len(pending):
            raise RuntimeError(f"vLLM returned {len(replies)} replies to {len(pending)} requests")
        for item in pending:
            reply = replies[item.request]
            tokens = {"visual_after": reply.video_tokens, "llm_input": reply.prompt_tokens, "generated": len(reply.ids)}
            text = reply_text(adapter.processor.tokenizer, reply.ids)  # as ottvid's engine decodes a reply
            record = make_record(item.sample, method, ratio, text, prompt=item.prompt, video=item.video,
                                 duration=item.duration, tokens=tokens, timings_ms={"decode": item.decode_ms})
            record["frames"] = item.frames
            write(record)
        pending.clear()

    groups = ahead(groups_by_video(todo, finder, frames), lambda group: _decoded(adapter, group), prefetch)
    try:
        for (ref, sampling, items), loaded, error in groups:
            failure = None
            if ref is None:
                failure = f"video not found under {finder.root}: {items[0][0].video}"
            elif error is not None:
                failure = sample_failure(error, ref.path)
            for n, (sample, _) in enumerate(items):
                prompt = build_prompt(sample)
                if failure is not None:
                    write(make_record(sample, method, ratio, error=failure, prompt=prompt,
                                      video=ref.path if ref is not None else None))
                    continue
                clip, video, metadata, decode_ms = loaded
                budget = max_new_tokens or protocol(sample.benchmark, sample.kind).max_new_tokens
                try:
                    request = engine.add(chat_text(adapter.processor, prompt), video, metadata, budget)
                except ValueError as exc:  # vLLM refused this request alone (longer than max_model_len, ...)
                    write(make_record(sample, method, ratio, error=sample_failure(exc), prompt=prompt, video=ref.path))
                    continue
                described = sampling.describe(clip, adapter.default_frames)
                described = {k: described[k] for k in ("requested", "count", "fps", "max_frames", "rule", "notes")}
                pending.append(_Pending(sample, prompt, request, clip.path, clip.duration, described,
                                        decode_ms if n == 0 else None))
            del loaded
            if len(pending) >= chunk:
                flush()
        flush()
    finally:
        groups.close()


def _setting(method: str, ratio: float) -> str:
    return "none" if method == "none" else f"{method} at {ratio * 100:g}%"
