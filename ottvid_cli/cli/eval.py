"""`ottvid eval`: run a benchmark (resumable, sharded, several settings per encode) or rescore a run.

Registered in app.py; it reuses the shared options, checks and one-line errors. Bad input (the
annotation file, the benchmark name, missing videos, a resume with other settings) is refused before
torch is imported. Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) each process runs its own
shard on its own device and rank 0 merges and scores once all are done (a gloo barrier).
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import timedelta
from pathlib import Path

import typer

from ..settings import SAMPLING_RULES as RULES
from ..settings import check_count
from .errors import EXIT_RUN, _fail, err, out
from .options import (
    Attention,
    Decoder,
    Device,
    Dtype,
    EvalFps,
    EvalFrames,
    EvalMaxPixels,
    Json,
    MaxFrames,
    Methods,
    Model,
    Preset,
    Quiet,
    Ratios,
    SiglipHead,
    _checked,
)
from .progress import _Progress
from .steps import _load, _run, _settle

BARRIER_TIMEOUT = timedelta(days=7)  # shards may finish hours apart


def eval_command(
    bench: str = typer.Argument(None, metavar="BENCH", help="Benchmark: mvbench, videomme, longvideobench, mlvu, charades, activitynet, "
                                           "timelens or jsonl (ours)."),
    data: str = typer.Option(None, "--data", metavar="PATH", rich_help_panel="Benchmark", help="The benchmark's annotation file or folder (docs/eval.md)."),
    videos: str = typer.Option(None, "--videos", metavar="DIR", rich_help_panel="Benchmark", help="Folder holding the benchmark's videos."),
    model: Model = None,
    method: Methods = None,
    ratio: Ratios = None,
    frames: EvalFrames = None,
    fps: EvalFps = None,
    max_frames: MaxFrames = None,
    limit: int = typer.Option(None, "--limit", metavar="N", rich_help_panel="Benchmark", callback=_checked(check_count, "--limit"),
                              help="Only the first N samples of the file."),
    out_dir: str = typer.Option(None, "--out", metavar="DIR", rich_help_panel="Benchmark",
                                show_default="runs/BENCH-MODEL",
                                help="Run folder: config.json, samples.jsonl, summary.json. Rerunning resumes it."),
    shard: str = typer.Option(None, "--shard", metavar="I/N", rich_help_panel="Benchmark", help="Run shard I of N (I from 0), e.g. 0/4; torchrun sets it."),
    skip_missing: bool = typer.Option(False, "--skip-missing", rich_help_panel="Benchmark", help="Run although some videos are missing "
                                                                    "(they are recorded as errors)."),
    retry_errors: bool = typer.Option(False, "--retry-errors", rich_help_panel="Benchmark", help="Run again the samples recorded with an error."),
    sampling_rule: str = typer.Option("lmms", "--sampling", metavar="RULE", rich_help_panel="Frames", help="Which frames a count picks: lmms (the ones "
                                      "lmms-eval's own model reads: qwen-vl-utils' rounded linspace for Qwen, "
                                      "truncated for LLaVA), centre (ottvid ask's: each segment's centre), "
                                      "linspace or linspace-floor."),
    prefetch: int = typer.Option(None, "--prefetch", min=0, metavar="N", rich_help_panel="Benchmark", show_default="1 on a GPU, 0 on the CPU",
                                 help="Videos decoded and preprocessed ahead, in background threads, while the "
                                      "model works (0: none)."),
    rescore: str = typer.Option(None, "--rescore", metavar="RUN", rich_help_panel="Scores", help="Judge every stored reply of RUN again with today's parsers "
                                                        "and metrics (samples.jsonl.bak keeps the old file), then "
                                                        "rebuild RUN/summary.json; no model."),
    table: list[str] = typer.Option(None, "--table", metavar="RUN", rich_help_panel="Scores",
                                    help="Table 1 from these run folders (repeat: one per benchmark): each setting's "
                                         "score per benchmark and its VQA / grounding average as a % of the "
                                         "uncompressed model's; no model."),
    compare: str = typer.Option(None, "--compare", metavar="RUN", rich_help_panel="Scores",
                                help="Another run folder whose uncompressed (--method none) scores give the "
                                     "relative %."),
    preset: Preset = "paper",
    as_json: Json = False,
    quiet: Quiet = False,
    device: Device = None,
    dtype: Dtype = None,
    attention: Attention = "auto",
    max_pixels: EvalMaxPixels = None,
    decoder: Decoder = "auto",
    siglip_head: SiglipHead = None,
) -> None:
    """Evaluate on a benchmark with the paper's protocol: one record per sample and setting, resumable."""
    from ..eval import EvalError
    from ..eval.store import StoreError

    try:
        if table:
            _show_table(_paper_table(table), as_json)
            return
        if rescore is not None:
            _show(_rescore(rescore, compare, data, as_json), as_json)
            return
        _evaluate(bench, data, videos, model, method, ratio, frames, fps, max_frames, limit, out_dir, shard,
                  skip_missing, retry_errors, compare, preset, as_json, quiet, device, dtype, attention, max_pixels,
                  decoder, siglip_head, prefetch, sampling_rule)
    except EvalError as exc:
        _fail(str(exc))
    except StoreError as exc:  # a record or the summary could not be written: what was written is kept
        _fail(str(exc), code=EXIT_RUN)


# ----------------------------------------------------------------------------- pieces


def parse_shard(value: str | None, env: dict | None = None) -> tuple[int, int, bool]:
    """(rank, shards, distributed): from --shard I/N, else torchrun's RANK / WORLD_SIZE, else (0, 1)."""
    env = os.environ if env is None else env
    if value is not None:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
        if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
            _fail(f"--shard must be I/N with 0 <= I < N, got {value!r}")
        return int(match.group(1)), int(match.group(2)), False
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        return int(env.get("RANK", "0")), world, True
    return 0, 1, False


def default_out(bench: str, model: str) -> str:
    name = Path(model.rstrip("/")).name or "model"
    return str(Path("runs") / f"{bench}-{name}")


def _vanilla(other: str, benchmark: str) -> dict:
    """The vanilla (method none) result of run folder `other`, a `benchmark` run (EvalError if not)."""
    from ..eval.benchmarks import EvalError
    from ..eval.scoring import VANILLA
    from ..eval.store import score

    if not Path(other).is_dir():
        raise EvalError(f"{other}: run folder to compare with not found")
    theirs, _ = score(other)
    if theirs["benchmark"] != benchmark:
        raise EvalError(f"{other}: a {theirs['benchmark']} run cannot be compared with a {benchmark} one")
    vanilla = next((r for r in theirs["results"] if r["method"] == VANILLA and r["count"] > r["errors"]), None)
    if vanilla is None:
        raise EvalError(f"{other}: no vanilla (method none) results to compare with")
    return vanilla


def _compare(summary: dict, other: str) -> dict:
    """Add `relative` (% of the other run's vanilla headline score) to each result."""
    from ..eval.scoring import headline, relative

    vanilla = _vanilla(other, summary["benchmark"])
    name = headline(vanilla["metrics"])
    for result in summary["results"]:
        value = relative(result["metrics"].get(name, 0.0), vanilla["metrics"][name])
        result["relative"] = round(value, 4) if value is not None else None
    summary["relative_to"] = str(other)
    return summary


def _rescore(run: str, compare: str | None, data: str | None = None, as_json: bool = False) -> dict:
    """--rescore RUN: refuse records of samples the run's annotation file (config.json's `data`, or
    --data) does not hold, re-judge every stored reply (store.rejudge), say how many verdicts changed
    per setting, then rebuild the summary."""
    from ..eval.benchmarks import EvalError
    from ..eval.store import CONFIG, load_config, load_records, rejudge, rescore, write_summary

    if not Path(run).is_dir():
        raise EvalError(f"{run}: run folder not found")
    config = load_config(run) if (Path(run) / CONFIG).exists() else {}
    records = load_records(run)
    benchmark = config.get("benchmark") or (records[0].get("benchmark") if records else None)
    data = data or config.get("data")
    if records and data and benchmark:
        _check_members(run, records, benchmark, data)
    changes = rejudge(run, benchmark) if records else []
    summary = rescore(run)
    if compare is not None:
        summary = _compare(summary, compare)
        write_summary(run, summary)
    summary["out"] = str(run)
    summary["rejudged"] = changes
    if not as_json:
        for change in changes:
            setting = "none" if change["method"] == "none" else f"{change['method']} {change['ratio']:g}"
            out.print(f"{setting}: {change['changed']} of {change['records']} verdicts changed "
                      f"({change['scores_changed']} scores)", highlight=False, markup=False)
    return summary


def _check_members(run, records, benchmark: str, data) -> None:
    """Every record is of a sample of the annotation file `data` (EvalError naming the first that is not)."""
    from ..eval import load_samples
    from ..eval.benchmarks import EvalError
    from ..eval.store import unknown_samples

    if not Path(data).exists():
        raise EvalError(f"{data}: the run's annotation file is not there (config.json's data): give --data FILE "
                        "to check the records against it")
    unknown = unknown_samples(records, load_samples(benchmark, data))
    if unknown:
        raise EvalError(f"{run}: {len(unknown)} records are of samples that {data} does not hold (first: "
                        f"{unknown[0]}): remove them from the record files, or use the annotation file of the run")


def _console():
    """stdout for a table: the terminal, or a console as wide as any table needs in a pipe or a file."""
    from ..report import table_console

    return table_console(out)


def _paper_table(runs: list[str]) -> dict:
    """Table 1 over run folders (their records, scored afresh; nothing is written): one column per
    run, named by its benchmark (and its annotation file's stem where two runs share a benchmark)."""
    from ..eval.benchmarks import EvalError
    from ..eval.scoring import paper_table
    from ..eval.store import score

    summaries, configs = [], []
    for run in runs:
        if not Path(run).is_dir():
            raise EvalError(f"{run}: run folder not found")
        summary, config = score(run)
        summaries.append(summary)
        configs.append(config)
    models = sorted({c.get("model") for c in configs if c.get("model")})
    if len(models) > 1:
        raise EvalError(f"the runs are of different models ({', '.join(models)}): a table compares settings of one model")
    names = [s["benchmark"] for s in summaries]
    labels = [name if names.count(name) == 1 else f"{name} ({Path(c.get('data') or run).stem})"
              for name, c, run in zip(names, configs, runs)]
    for n, label in enumerate(labels):
        if label in labels[:n]:
            raise EvalError(f"{runs[labels.index(label)]} and {runs[n]} are both {label}: give each benchmark once")
    result = paper_table(summaries, labels, [m for c in configs for m in c.get("methods") or []])
    result["model"] = models[0] if models else ""
    result["runs"] = list(runs)
    return result


def _show_table(table: dict, as_json: bool) -> None:
    from rich.table import Table

    if as_json:
        typer.echo(json.dumps(table, indent=2, ensure_ascii=False))
        return
    view = Table(title=f"Table 1: {table['model'] or 'model ?'} (accuracy for VQA, mIoU for grounding, %; "
                       f"Avg.: % of vanilla)", title_justify="left")
    view.add_column("method")
    view.add_column("ratio", justify="right")
    cells: list[tuple[str, str, str | None]] = []  # (header, family, label or None for the average)
    for family, name in (("vqa", "VQA Avg. (%)"), ("grounding", "VTG Avg. (%)")):
        columns = [c for c in table["columns"] if c["family"] == family]
        cells += [(c["label"], family, c["label"]) for c in columns]
        if columns:
            cells.append((name, family, None))
    for header, _, _ in cells:
        view.add_column(header, justify="right")

    def number(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    for row in table["rows"]:
        values = [number(row["scores"][label] if label is not None else row["average"][family])
                  for _, family, label in cells]
        view.add_row(row["method"], "100%" if row["method"] == "none" else f"{row['ratio'] * 100:g}%", *values)
    _console().print(view)


def _show(summary: dict, as_json: bool, failed_run: bool = False) -> None:
    from rich.table import Table

    if as_json:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
        return
    results = summary["results"]
    names: list[str] = []
    for result in results:
        for name in result["metrics"]:
            if "/" not in name and name not in names:
                names.append(name)
    table = Table(title=f"{summary['benchmark']}, {summary.get('model') or 'model ?'}", title_justify="left")
    for column in ("method", "ratio", "samples", "errors", *names):
        table.add_column(column, justify="left" if column == "method" else "right")
    if any("relative" in r for r in results):
        table.add_column("relative %", justify="right")
    for result in results:
        row = [result["method"], f"{result['ratio']:g}", str(result["count"]), str(result["errors"])]
        row += [f"{result['metrics'][n]:.2f}" if n in result["metrics"] else "-" for n in names]
        if "relative" in result:
            row.append("-" if result["relative"] is None else f"{result['relative']:.1f}")
        table.add_row(*row)
    console = _console()
    console.print(table)
    if summary.get("out"):
        console.print(f"records and summary in {summary['out']}", highlight=False, soft_wrap=True)
    errors = sum(r["errors"] for r in results)
    if errors and not (failed_run and errors == sum(r["count"] for r in results)):  # then one error line says it
        err.print(f"{errors} records hold an error (left out of the metrics; a subset is not comparable with the "
                  f"paper's tables): see the `error` field in samples.jsonl", highlight=False)


class _Bar:
    """Samples done / total, rate and ETA on stderr: a bar on a terminal, a plain line every 10 s (and
    at the end) otherwise, nothing with --quiet."""

    def __init__(self, quiet: bool, label: str):
        self.quiet, self.label, self.last = quiet, label, 0.0
        self.bar = self.task = None
        if not quiet and err.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                TimeRemainingColumn(), console=err)

    def __call__(self, p) -> None:
        rate = f"{p.rate * 60:.1f}/min" if p.rate else ""
        if self.bar is not None:
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=p.total, rate=rate)
            self.bar.update(self.task, completed=p.done, rate=rate)
            return
        now = time.perf_counter()
        if self.quiet or not (p.done == p.total or now - self.last >= 10 or p.done == 0):
            return
        self.last = now
        eta = f", ETA {p.eta / 60:.1f} min" if p.eta is not None and p.done < p.total else ""
        errors = f", {p.errors} errors" if p.errors else ""
        err.print(f"{self.label}: {p.done}/{p.total} samples{errors}, {rate or '-'}{eta}", highlight=False,
                  markup=False)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _evaluate(bench, data, videos, model, method, ratio, frames, fps, max_frames, limit, out_dir, shard_arg,
              skip_missing, retry_errors, compare, preset, as_json, quiet, device, dtype, attention, max_pixels,
              decoder, siglip_head=None, prefetch=None, sampling_rule="lmms") -> None:
    from ..eval import check_benchmark, load_samples, missing_videos, save_config
    from ..eval.runner import FramePlan, kinds, settings
    from ..eval.store import RecordLock
    from ..settings import model_key

    if bench is None:
        _fail("give a benchmark (see `ottvid eval --help`), or --rescore RUN")
    check_benchmark(bench)
    if data is None or videos is None:
        _fail("give the annotations (--data) and the videos folder (--videos)")
    if frames is not None and fps is not None:
        _fail("give --frames or --fps, not both")
    model, device, dtype, default_ratio, _ = _settle(model, device, dtype, None, None, None, config_frames=False)
    methods = method or ["ottvid"]
    ratios = ratio or [default_ratio]
    runs = settings(methods, ratios)
    rank, shards, distributed = parse_shard(shard_arg)
    every = samples = load_samples(bench, data)
    if limit is not None:
        samples = samples[:limit]
    missing = missing_videos(samples, videos)
    if missing and not skip_missing:
        _fail(f"{len(missing)} of {len(samples)} samples have no video under {videos} (first: {missing[0].video}); "
              f"add --skip-missing to run the others")
    if sampling_rule not in ("lmms", *RULES):
        _fail(f"--sampling must be one of lmms, {', '.join(RULES)}, got {sampling_rule!r}")
    plan = FramePlan(frames=frames, fps=fps, max_frames=max_frames, max_pixels=max_pixels, decoder=decoder,
                     rule=None if sampling_rule == "lmms" else sampling_rule)
    out_dir = out_dir or default_out(bench, model)
    config = {"benchmark": bench, "data": str(Path(data).resolve()), "videos": str(Path(videos).resolve()),
              "model": model_key(model), "methods": list(dict.fromkeys(methods)),
              "ratios": sorted(set(ratios), reverse=True), "frames": frames, "fps": fps, "max_frames": max_frames,
              "sampling": plan.describe(bench, kinds(samples)), "max_pixels": max_pixels, "preset": preset,
              "decoder": decoder, "siglip_head": siglip_head and model_key(siglip_head), "limit": limit,
              "skip_missing": skip_missing, "samples": len(samples)}
    if compare is not None:
        _vanilla(compare, bench)  # a bad --compare is refused now, not after the run
    group = _Group(distributed)
    lock = []

    def prepare() -> None:  # rank 0 (or the only process): a refusal stops every rank
        lock.append(RecordLock(out_dir, rank, shards))  # a second run of this shard is refused
        try:
            _check_run_folder(out_dir, samples, data, every)
            save_config(out_dir, config)
        except BaseException:
            lock.pop().release()
            raise

    group.first(prepare)
    previous = _stop_on_sigterm()
    try:
        if not lock:  # the other ranks: their own record file's lock
            lock.append(RecordLock(out_dir, rank, shards))
        if distributed and device in (None, "auto", "cuda"):  # one GPU per process
            device = _rank_device()
        stats = None
        if _left_to_run(out_dir, samples, runs, rank, shards, retry_errors):
            progress = _Progress(quiet or rank > 0 and distributed)
            backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
            progress.stop()
            from ..eval.runner import run

            label = f"{bench} shard {rank}/{shards}" if shards > 1 else bench
            bar = _Bar(quiet, label)
            try:
                stats = _run(lambda: run(backbone, samples, out_dir, runs, videos, plan, rank=rank, shards=shards,
                                             preset=preset, retry_errors=retry_errors, on_progress=bar,
                                             prefetch=prefetch),
                                 _Progress(True))
            finally:
                bar.stop()
        elif not quiet:
            err.print(f"every sample of {out_dir} has its records already: scoring them (no model loaded; "
                      f"--retry-errors runs the failed ones again)", highlight=False, markup=False, soft_wrap=True)
    except KeyboardInterrupt as exc:
        group.close()
        terminated = isinstance(exc, _Terminated)
        _fail(_interrupted(out_dir, "terminated (SIGTERM)" if terminated else "interrupted"),
              code=143 if terminated else 130)
    finally:
        _restore_sigterm(previous)
        for held in lock:
            held.release()  # before the barrier: rank 0 merges every shard file next
    if stats is not None and 0 < stats.errors < stats.records and not quiet:
        err.print(f"{stats.errors} of {stats.records} records hold an error", highlight=False)
    group.barrier()
    if rank != 0 and distributed:
        group.close()
        return
    summary = _finish(out_dir, samples, runs, shards, rank, distributed, quiet)
    group.close()
    if summary is None:
        return
    if compare is not None:
        from ..eval.store import write_summary

        summary = _compare(summary, compare)
        write_summary(out_dir, summary)
    summary["out"] = str(out_dir)
    _show(summary, as_json, failed_run=True)
    _fail_if_nothing_evaluated(summary, out_dir)


def _left_to_run(out_dir, samples, runs, rank: int, shards: int, retry_errors: bool) -> int:
    """How many (sample, method, ratio) of this shard OUT holds no record of yet (with
    --retry-errors, error records count as not done): checked before the model loads."""
    from ..eval.store import load_records, record_key, shard

    done = {record_key(r["id"], r["method"], r["ratio"]) for r in load_records(out_dir)
            if not (retry_errors and r.get("error") is not None)}
    return sum(1 for s in shard(samples, rank, shards) for m, r in runs if record_key(s.id, m, r) not in done)


def _fail_if_nothing_evaluated(summary: dict, out_dir) -> None:
    """A run in which no sample could be evaluated (every record holds an error) exits 1 with one
    line; the records are kept."""
    results = summary["results"]
    records = sum(r["count"] for r in results)
    if records and all(r["errors"] == r["count"] for r in results):
        _fail(f"no sample could be evaluated: all {records} records hold an error (kept in {out_dir}; see the "
              f"`error` field in samples.jsonl)", code=EXIT_RUN)


def _finish(out_dir, samples, runs, shards, rank, distributed, quiet) -> dict | None:
    """Merge the shards and score when the whole run is done (rank 0 after the barrier, or whichever
    --shard process finds nothing left); otherwise say what remains."""
    from ..eval.runner import remaining
    from ..eval.store import RunInUse, merge_shards, rescore, sample_files

    left = remaining(out_dir, samples, runs)
    if left and shards > 1 and not distributed:
        if not quiet:
            err.print(f"shard {rank}/{shards} done; {left} records of other shards remain (the last shard to "
                      f"finish merges and scores, or run `ottvid eval --rescore {out_dir}`)", highlight=False)
        return None
    if len(sample_files(out_dir)) > 1 or not (Path(out_dir) / "samples.jsonl").exists():
        try:
            merge_shards(out_dir)
        except RunInUse as exc:  # another process still writes a record file: it merges when it ends
            if not quiet:
                err.print(f"not merged yet: {exc}", highlight=False, markup=False)
    return rescore(out_dir)


def _check_run_folder(out_dir, samples=(), data=None, every=None) -> None:
    """Before the model loads: every record file of OUT reads (a damaged one is named with its
    line), records come with the config.json that says which run they belong to, they are all of
    samples of the annotation file (`every`: all of its samples, --limit or not), and they were made
    from the questions `samples` are now (not from an edited annotation file or another prompt)."""
    from ..eval.benchmarks import EvalError
    from ..eval.store import CONFIG, changed_samples, load_records, unknown_samples

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
    from ..eval.store import load_records

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

    def first(self, work) -> None:
        from ..eval.benchmarks import EvalError

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

