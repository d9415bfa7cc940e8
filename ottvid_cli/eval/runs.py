"""A whole evaluation run: its settings checked before any model loads (`plan_run`), then run or resumed
in its run folder (`evaluate`, `resume`): sharded (`--shard I/N`, or torchrun's RANK / WORLD_SIZE with
one device per process and a gloo barrier before rank 0 merges), locked against a second process on
the same shard, stopped cleanly by Ctrl-C or SIGTERM, then merged and scored.

The model is the caller's: `evaluate` asks `load(device)` for it only when something is left to run.
Nothing here prints; what a caller shows comes through `on_start` / `on_progress` and the outcome.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from ..checks import SAMPLING_RULES
from ..model_source import model_key
from .benchmarks import EvalError, Sample, check_benchmark, load_samples, missing_videos
from .errors import RunInUse
from .record_files import load_records, sample_files
from .records import changed_samples, record_key, unknown_samples
from .results import compare, vanilla_of
from .run_config import CONFIG, load_config, save_config
from .runner import FramePlan, Progress, RunStats, Setting, kinds, remaining, settings
from .shards import merge_shards, shard
from .store import RecordLock
from .summary import rescore, write_summary

BARRIER_TIMEOUT = timedelta(days=7)  # shards may finish hours apart
LMMS = "lmms"  # the sampling rule lmms-eval's own model reads for the backbone
VLLM_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")  # what the vLLM plugin serves


@dataclass
class EvalRequest:
    """The settings of a run, as the command line gives them (model, device and dtype already
    resolved). `out`: the run folder (default runs/BENCH-MODEL); `shard`: "I/N" (None: torchrun's
    RANK / WORLD_SIZE, else the whole run); `sampling`: "lmms" or one of `checks.SAMPLING_RULES`;
    `compare`: a run folder whose vanilla scores give the relative %."""

    bench: str
    data: str
    videos: str
    model: str
    methods: Sequence[str] = ("ottvid",)
    ratios: Sequence[float] = (0.1,)
    frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    limit: int | None = None
    out: str | None = None
    shard: str | None = None
    skip_missing: bool = False
    retry_errors: bool = False
    sampling: str = LMMS
    prefetch: int | None = None
    compare: str | None = None
    preset: str = "paper"
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    max_pixels: int | None = None
    decoder: str = "auto"
    siglip_head: str | None = None
    keyframes: bool = False  # key frames instead of the protocol's frames: only when asked for by name
    # frames prepared at a time ("all": each video at once, decoded ahead while the model works; a number or
    # "auto": a long video chunk by chunk, `chunked`); the records do not depend on it, so the config omits it
    chunk_frames: int | str = "all"
    engine: str = "ottvid"  # who answers: ottvid's own engine, or vLLM (one in-process engine per setting)
    tensor_parallel_size: int = 1  # vLLM only
    engine_args: dict = field(default_factory=dict)  # vLLM only: more `vllm.LLM` arguments (--engine-arg)
    chunk: int = 64  # vLLM only: requests handed to the engine at once


@dataclass
class RunPlan:
    """A checked request: the samples (`every`: all of the annotation file's, `samples`: after
    `limit`), the (method, ratio) settings, this process's shard, the frame plan, the run folder and
    the config.json it records."""

    request: EvalRequest
    every: list[Sample]
    samples: list[Sample]
    runs: list[Setting]
    rank: int
    shards: int
    distributed: bool
    frames: FramePlan
    out: str
    config: dict = field(repr=False)


@dataclass
class RunStart:
    """What this shard's run folder held when the run started (before the model loads): `samples` of
    this shard, `done` of them with every record already, `kept` records there already, `left` to run."""

    out: str
    samples: int
    done: int
    kept: int
    left: int


@dataclass
class RunOutcome:
    """What `evaluate` did: the summary (None on a torchrun rank other than 0, or while other shards'
    records remain: `waiting` says how many), the runner's stats (None when nothing was left to run),
    and `unmerged`: why the shards could not be merged yet ("" when they were, or needed no merge)."""

    plan: RunPlan
    start: RunStart
    summary: dict | None = None
    stats: RunStats | None = None
    waiting: int = 0
    unmerged: str = ""


class RunStopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; the records written are kept. The message is one line."""

    def __init__(self, message: str, terminated: bool = False):
        super().__init__(message)
        self.terminated = terminated


# ----------------------------------------------------------------------------- checks before the model


def parse_shard(value: str | None, env: dict | None = None) -> tuple[int, int, bool]:
    """(rank, shards, distributed): from "I/N", else torchrun's RANK / WORLD_SIZE, else (0, 1)."""
    env = os.environ if env is None else env
    if value is not None:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
        if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
            raise EvalError(f"--shard must be I/N with 0 <= I < N, got {value!r}")
        return int(match.group(1)), int(match.group(2)), False
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        return int(env.get("RANK", "0")), world, True
    return 0, 1, False


ENGINES = ("ottvid", "vllm")


def parse_engine_args(items: Sequence[str]) -> dict[str, Any]:
    """--engine-arg KEY=VALUE items as `vllm.LLM` keyword arguments: VALUE read as JSON where it is JSON
    (numbers, true / false, objects, lists), else as the string itself. EvalError, one line, for an item
    without KEY=."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise EvalError(f"--engine-arg takes KEY=VALUE (a vllm.LLM argument, e.g. max_model_len=32768), "
                            f"got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def check_engine(r: EvalRequest, runs: Sequence[Setting], distributed: bool) -> None:
    """The engine's own checks, before anything starts: --engine vllm serves Qwen2.5-VL and Qwen3-VL (the
    plugin's models) with every setting the plugin takes, in an environment with vLLM, its engine
    arguments known to vLLM; the vLLM-only options are refused with the ottvid engine. EvalError, one line."""
    from ..model_source import ModelError, model_config

    if r.engine not in ENGINES:
        raise EvalError(f"--engine must be one of {', '.join(ENGINES)}, got {r.engine!r}")
    if r.engine == "ottvid":
        given = [flag for flag, on in (("--tensor-parallel-size", r.tensor_parallel_size != 1),
                                       ("--engine-arg", bool(r.engine_args))) if on]
        if given:
            raise EvalError(f"{' and '.join(given)} apply to --engine vllm only")
        return
    if r.tensor_parallel_size < 1:
        raise EvalError(f"--tensor-parallel-size must be at least 1, got {r.tensor_parallel_size}")
    if r.chunk < 1:
        raise EvalError(f"the chunk of requests must be at least 1, got {r.chunk}")
    others = [flag for flag, on in (("--device", r.device not in (None, "auto")),
                                    ("--attention", r.attention not in (None, "auto")),
                                    ("--siglip-head", r.siglip_head is not None)) if on]
    if others:
        raise EvalError(f"{', '.join(others)} apply to --engine ottvid only (vLLM chooses its device and attention; "
                        f"pass its own options with --engine-arg KEY=VALUE)")
    if distributed:
        raise EvalError("--engine vllm does not run under torchrun: start one process per GPU with --shard I/N and "
                        "CUDA_VISIBLE_DEVICES=I (docs/eval.md), or one engine over several with --tensor-parallel-size")
    try:
        kind = model_config(r.model).model_type
    except ModelError as exc:
        raise EvalError(str(exc)) from None
    if kind not in VLLM_MODEL_TYPES:
        raise EvalError(f"--engine vllm runs Qwen2.5-VL and Qwen3-VL (dense and MoE), the models ottvid's vLLM plugin "
                        f"serves; {r.model} is {kind}: use --engine ottvid")
    from ..integrations.vllm.offline import RESERVED, pruning_rate
    from ..integrations.vllm.settings import SettingsError, read

    for key in r.engine_args:
        if key in RESERVED:
            raise EvalError(f"--engine-arg {key} is set by ottvid: use {RESERVED[key]}")
    for name in ("ottvid_method", "ottvid_method_args", "ottvid_preset"):
        if name in (r.engine_args.get("hf_overrides") or {}):
            raise EvalError(f"--engine-arg hf_overrides may not set {name}: ottvid sets it from --method / --preset")
    for method, ratio in runs:
        if method == "none":
            continue
        try:
            read(SimpleNamespace(ottvid_method=method, ottvid_preset=r.preset), pruning_rate(ratio))
        except SettingsError as exc:
            raise EvalError(f"--engine vllm cannot run {method} at {ratio:g}: {exc}") from None
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.submodule_search_locations is None:  # none, or a vllm.py that is not the package
        raise EvalError('--engine vllm needs vLLM in this environment: pip install -e ".[vllm]" from a checkout of '
                        'ottvid (docs/vllm.md)')
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(r.engine_args) - known)
    if unknown:
        raise EvalError(f"--engine-arg {unknown[0]} is not an argument of this vLLM's engine (vllm.EngineArgs)")


def default_out(bench: str, model: str) -> str:
    """The default run folder: runs/BENCH-MODEL (the model folder's or hub id's last part)."""
    name = Path(model.rstrip("/")).name or "model"
    return str(Path("runs") / f"{bench}-{name}")


def plan_run(request: EvalRequest) -> RunPlan:
    """Check `request` without a model (the benchmark, its annotations, the videos, the settings, the
    shard, --compare's run) and plan it; bad input is a one-line EvalError."""
    r = request
    check_benchmark(r.bench)
    if r.data is None or r.videos is None:
        raise EvalError("give the annotations (--data) and the videos folder (--videos)")
    if r.frames is not None and r.fps is not None:
        raise EvalError("give --frames or --fps, not both")
    runs = settings(r.methods, r.ratios)
    rank, shards, distributed = parse_shard(r.shard)
    check_engine(r, runs, distributed)
    every = samples = load_samples(r.bench, r.data)
    if r.limit is not None:
        samples = samples[:r.limit]
    missing = missing_videos(samples, r.videos)
    if missing and not r.skip_missing:
        raise EvalError(f"{len(missing)} of {len(samples)} samples have no video under {r.videos} (first: "
                        f"{missing[0].video}); add --skip-missing to run the others")
    if r.sampling not in (LMMS, *SAMPLING_RULES):
        raise EvalError(f"--sampling must be one of {LMMS}, {', '.join(SAMPLING_RULES)}, got {r.sampling!r}")
    frames = FramePlan(frames=r.frames, fps=r.fps, max_frames=r.max_frames, max_pixels=r.max_pixels,
                       decoder=r.decoder, rule=None if r.sampling == LMMS else r.sampling, keyframes=r.keyframes,
                       chunk_frames=r.chunk_frames)
    out = r.out or default_out(r.bench, r.model)
    config = {"benchmark": r.bench, "data": str(Path(r.data).resolve()), "videos": str(Path(r.videos).resolve()),
              "model": model_key(r.model), "methods": list(dict.fromkeys(r.methods)),
              "ratios": sorted(set(r.ratios), reverse=True), "frames": r.frames, "fps": r.fps,
              "max_frames": r.max_frames, "sampling": frames.describe(r.bench, kinds(samples)),
              "max_pixels": r.max_pixels, "preset": r.preset, "decoder": r.decoder,
              "siglip_head": r.siglip_head and model_key(r.siglip_head), "limit": r.limit,
              "skip_missing": r.skip_missing, "samples": len(samples),
              **({"keyframes": True} if r.keyframes else {})}  # absent when off: runs written before it match
    if r.compare is not None:
        vanilla_of(r.compare, r.bench)  # a bad --compare is refused now, not after the run
    return RunPlan(request=r, every=every, samples=samples, runs=runs, rank=rank, shards=shards,
                   distributed=distributed, frames=frames, out=out, config=config)


def check_run_folder(out_dir: Path | str, samples: Sequence[Sample] = (), data: Any = None,
                     every: Sequence[Sample] | None = None) -> None:
    """Before the model loads: every record file of OUT reads (a damaged one is named with its
    line), records come with the config.json that says which run they belong to, they are all of
    samples of the annotation file (`every`: all of its samples, --limit or not), and they were made
    from the questions `samples` are now (not from an edited annotation file or another prompt)."""
    records = load_records(out_dir)
    if records and not (Path(out_dir) / CONFIG).exists():
        raise EvalError(f"{out_dir}: holds {len(records)} sample records but no {CONFIG}, so which run they "
                        "belong to is unknown; use another --out (or put its config.json back)")
    unknown = unknown_samples(records, every) if every is not None else []
    if unknown:
        raise EvalError(f"{out_dir}: {len(unknown)} records are of samples that {data} does not hold (first: "
                        f"{unknown[0]}): use another --out, or remove them from the record files")
    changed = changed_samples(records, samples)
    if changed:
        raise EvalError(f"{out_dir}: {len(changed)} samples were run with another prompt or answer than {data} gives "
                        f"now (first: {changed[0]}; the file or ottvid's prompt changed): use another --out, or "
                        f"`ottvid eval --rescore {out_dir}` to score the records as they are")


# ----------------------------------------------------------------------------- the run


def evaluate(request: EvalRequest | RunPlan, load: Callable[[str], Any], *,
             on_start: Callable[[RunStart], None] | None = None,
             on_progress: Callable[[Progress], None] | None = None,
             call: Callable[[Callable[[], RunStats]], RunStats] | None = None) -> RunOutcome:
    """Run (or resume) a request in its run folder and score it once the whole run is done.

    `load(device)`: the backbone, asked for only when this shard has records left to run (`device`:
    this process's GPU under torchrun, else the request's). `on_start`: told what the folder held,
    after it was locked and checked, before the model loads. `on_progress`: the runner's progress.
    `call(work)`: runs the model work (default `work()`; the CLI maps its failures to one-line errors).
    Raises EvalError for bad input or a folder of another run, errors.StoreError when a record cannot
    be written, RunStopped on Ctrl-C / SIGTERM (the records are kept)."""
    from .runner import run

    plan = request if isinstance(request, RunPlan) else plan_run(request)
    r = plan.request
    group = _Group(plan.distributed)
    lock: list[RecordLock] = []

    def prepare() -> None:  # rank 0 (or the only process): a refusal stops every rank
        lock.append(RecordLock(plan.out, plan.rank, plan.shards))  # a second run of this shard is refused
        try:
            check_run_folder(plan.out, plan.samples, r.data, plan.every)
            save_config(plan.out, plan.config)
        except BaseException:
            lock.pop().release()
            raise

    group.first(prepare)
    previous = _stop_on_sigterm()
    stats = None
    try:
        if not lock:  # the other ranks: their own record file's lock
            lock.append(RecordLock(plan.out, plan.rank, plan.shards))
        device = r.device
        if plan.distributed and device in (None, "auto", "cuda"):  # one GPU per process
            device = _rank_device()
        start = _start(plan)
        if on_start is not None:
            on_start(start)
        if start.left:
            common = dict(rank=plan.rank, shards=plan.shards, preset=r.preset, retry_errors=r.retry_errors,
                          on_progress=on_progress, prefetch=r.prefetch)
            if r.engine == "vllm":  # no backbone: vLLM loads the model, one engine per setting
                from .vllm_runner import VllmOptions, run_vllm

                options = VllmOptions(tensor_parallel_size=r.tensor_parallel_size, engine_args=dict(r.engine_args),
                                      dtype=None if r.dtype in (None, "auto") else r.dtype, chunk=r.chunk)

                def work() -> RunStats:
                    return run_vllm(r.model, plan.samples, plan.out, plan.runs, r.videos, plan.frames,
                                    options=options, **common)
            else:
                backbone = load(device)

                def work() -> RunStats:
                    return run(backbone, plan.samples, plan.out, plan.runs, r.videos, plan.frames, **common)

            stats = call(work) if call is not None else work()
    except KeyboardInterrupt as exc:
        group.close()
        terminated = isinstance(exc, _Terminated)
        raise RunStopped(_interrupted(plan.out, "terminated (SIGTERM)" if terminated else "interrupted"),
                         terminated) from None
    finally:
        _restore_sigterm(previous)
        for held in lock:
            held.release()  # before the barrier: rank 0 merges every shard file next
    outcome = RunOutcome(plan=plan, start=start, stats=stats)
    group.barrier()
    try:
        if plan.rank != 0 and plan.distributed:
            return outcome
        _finish(outcome)
    finally:
        group.close()
    if outcome.summary is not None:
        if r.compare is not None:
            outcome.summary = compare(outcome.summary, r.compare)
            write_summary(plan.out, outcome.summary)
        outcome.summary["out"] = str(plan.out)
    return outcome


def request_of(out_dir: Path | str, **changes: Any) -> EvalRequest:
    """The request that made run folder OUT, from its config.json, with `changes` (e.g. device,
    shard, retry_errors, more methods or ratios) applied."""
    config = load_config(out_dir)
    rules = {kind.get("rule") for kind in (config.get("sampling") or {}).values() if isinstance(kind, dict)}
    rule = next((rule for rule in rules if rule in SAMPLING_RULES), LMMS)
    keys = ("frames", "fps", "max_frames", "max_pixels", "preset", "decoder", "siglip_head", "limit", "skip_missing",
            "keyframes")
    try:
        request = EvalRequest(bench=config["benchmark"], data=config["data"], videos=config["videos"],
                              model=config["model"], methods=list(config["methods"]), ratios=list(config["ratios"]),
                              out=str(out_dir), sampling=rule, **{k: config[k] for k in keys if k in config})
    except (KeyError, TypeError) as exc:
        raise EvalError(f"{Path(out_dir) / CONFIG}: not a run config ottvid wrote ({exc})") from None
    return replace(request, **changes)


def resume(out_dir: Path | str, load: Callable[[str], Any], **options: Any) -> RunOutcome:
    """Resume run folder OUT with the settings its config.json records (`request_of`); `options`:
    `evaluate`'s keyword arguments and the request's changes."""
    calls = {k: options.pop(k) for k in ("on_start", "on_progress", "call") if k in options}
    return evaluate(request_of(out_dir, **options), load, **calls)


def _start(plan: RunPlan) -> RunStart:
    """What this shard's folder holds of the run (with retry_errors, error records count as not done)."""
    retry = plan.request.retry_errors
    done = {record_key(r["id"], r["method"], r["ratio"]) for r in load_records(plan.out)
            if not (retry and r.get("error") is not None)}
    mine = shard(plan.samples, plan.rank, plan.shards)
    have = [sum(1 for m, ratio in plan.runs if record_key(s.id, m, ratio) in done) for s in mine]
    kept = sum(have)
    return RunStart(out=str(plan.out), samples=len(mine), done=sum(1 for n in have if n == len(plan.runs)),
                    kept=kept, left=len(mine) * len(plan.runs) - kept)


def _finish(outcome: RunOutcome) -> None:
    """Merge the shards and score when the whole run is done (rank 0 after the barrier, or whichever
    --shard process finds nothing left); otherwise count what other shards still have to run."""
    plan = outcome.plan
    left = remaining(plan.out, plan.samples, plan.runs)
    if left and plan.shards > 1 and not plan.distributed:
        outcome.waiting = left
        return
    if len(sample_files(plan.out)) > 1 or not (Path(plan.out) / "samples.jsonl").exists():
        try:
            merge_shards(plan.out)
        except RunInUse as exc:  # another process still writes a record file: it merges when it ends
            outcome.unmerged = str(exc)
    outcome.summary = rescore(plan.out)


# ----------------------------------------------------------------------------- stopping, torchrun


class _Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, torchrun stopping the other ranks when one fails): the same clean stop as Ctrl-C."""


def _stop_on_sigterm() -> object:
    """Turn SIGTERM into `_Terminated` while the run goes on (main thread only); the previous handler."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise _Terminated()

    return signal.signal(signal.SIGTERM, stop)


def _restore_sigterm(previous: object) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(out_dir, what: str = "interrupted") -> str:
    try:
        kept = f"{len(load_records(out_dir))} records kept in {out_dir}"
    except Exception:  # noqa: BLE001 - the message must not fail
        kept = f"the records written are kept in {out_dir}"
    return f"{what}: {kept}; run the same command again to resume"


def _rank_device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "auto"


class _Group:
    """torch.distributed (gloo) for torchrun: rank 0 does one-time work first and tells the others
    whether it failed; a barrier before rank 0 merges. Nothing when not distributed."""

    def __init__(self, distributed: bool):
        self.dist = None
        if distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
            self.dist = dist

    def first(self, work: Callable[[], None]) -> None:
        if self.dist is None:
            work()
            return
        message = [None]
        if self.dist.get_rank() == 0:
            try:
                work()
            except EvalError as exc:
                message = [str(exc)]
        self.dist.broadcast_object_list(message, src=0)
        if message[0] is not None:
            self.close()
            raise EvalError(message[0])

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def close(self) -> None:
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()
        self.dist = None
