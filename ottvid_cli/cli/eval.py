"""`ottvid eval`: run a benchmark (resumable, sharded, several settings per encode) or rescore a run.

Registered in app.py; it reuses the shared options, checks and one-line errors. The run itself is the
library's (`ottvid_cli.eval`: `evaluate`, `score_run`, `table`); this module parses, calls and renders.
Bad input (the annotation file, the benchmark name, missing videos, a resume with other settings) is
refused before torch is imported. Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) each process runs
its own shard on its own device and rank 0 merges and scores once all are done.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import typer

from ..checks import check_chunk_frames, check_count
from .errors import EXIT_RUN, err, fail, out
from .options import EvalFps, EvalFrames, EvalMaxPixels, MaxFrames, Methods, Ratios, checked, with_options
from .progress import Progress
from .request import ModelChoice, settle
from .steps import load_model, run

if TYPE_CHECKING:
    from ..eval import EvalRequest, RunStart


@with_options("bench", "data", "videos", "model", "method", "ratio", "frames", "fps", "max_frames", "limit", "out_dir",
              "shard", "skip_missing", "retry_errors", "sampling_rule", "prefetch", "rescore", "table", "compare",
              "preset", "as_json", "quiet", "device", "dtype", "attention", "max_pixels", "decoder", "chunk_frames",
              "keyframes", "siglip_head", "engine", "tensor_parallel_size", "engine_arg", "chunk")
def eval_command(
    bench: str = typer.Argument(None, metavar="BENCH",
                                help="Benchmark: mvbench, videomme, longvideobench, mlvu, charades, activitynet, "
                                     "timelens or jsonl (ours)."),
    data: str = typer.Option(None, "--data", metavar="PATH", rich_help_panel="Benchmark",
                             help="The benchmark's annotation file or folder (docs/eval.md)."),
    videos: str = typer.Option(None, "--videos", metavar="DIR", rich_help_panel="Benchmark",
                               help="Folder holding the benchmark's videos."),
    method: Methods = None,
    ratio: Ratios = None,
    frames: EvalFrames = None,
    fps: EvalFps = None,
    max_frames: MaxFrames = None,
    limit: int = typer.Option(None, "--limit", metavar="N", rich_help_panel="Benchmark",
                              callback=checked(check_count, "--limit"), help="Only the first N samples of the file."),
    out_dir: str = typer.Option(None, "--out", metavar="DIR", rich_help_panel="Benchmark",
                                show_default="runs/BENCH-MODEL",
                                help="Run folder: config.json, samples.jsonl, summary.json. Rerunning resumes it."),
    shard: str = typer.Option(None, "--shard", metavar="I/N", rich_help_panel="Benchmark",
                              help="Run shard I of N (I from 0), e.g. 0/4; torchrun sets it."),
    skip_missing: bool = typer.Option(False, "--skip-missing", rich_help_panel="Benchmark",
                                      help="Run although some videos are missing (they are recorded as errors)."),
    retry_errors: bool = typer.Option(False, "--retry-errors", rich_help_panel="Benchmark",
                                      help="Run again the samples recorded with an error."),
    sampling_rule: str = typer.Option("lmms", "--sampling", metavar="RULE", rich_help_panel="Frames",
                                      help="Which frames a count picks: lmms (the ones lmms-eval's own model reads: "
                                           "qwen-vl-utils' rounded linspace for Qwen, truncated for LLaVA), centre "
                                           "(ottvid ask's: each segment's centre), linspace or linspace-floor."),
    prefetch: int = typer.Option(None, "--prefetch", min=0, metavar="N", rich_help_panel="Benchmark",
                                 show_default="1 on a GPU, 0 on the CPU",
                                 help="Videos decoded and preprocessed ahead, in background threads, while the "
                                      "model works (0: none)."),
    rescore: str = typer.Option(None, "--rescore", metavar="RUN", rich_help_panel="Scores",
                                help="Judge every stored reply of RUN again with today's parsers and metrics "
                                     "(samples.jsonl.bak keeps the old file), then rebuild RUN/summary.json; no "
                                     "model."),
    table: list[str] = typer.Option(None, "--table", metavar="RUN", rich_help_panel="Scores",
                                    help="Table 1 from these run folders (repeat: one per benchmark): each setting's "
                                         "score per benchmark and its VQA / grounding average as a % of the "
                                         "uncompressed model's; no model."),
    compare: str = typer.Option(None, "--compare", metavar="RUN", rich_help_panel="Scores",
                                help="Another run folder whose uncompressed (--method none) scores give the "
                                     "relative %."),
    max_pixels: EvalMaxPixels = None,
    chunk_frames: str = typer.Option(None, "--chunk-frames", metavar="N|all|auto", rich_help_panel="Frames",
                                     callback=checked(check_chunk_frames, "--chunk-frames"), show_default="all",
                                     help="Frames decoded, encoded and compressed at a time: a number or auto "
                                          "prepares a long video chunk by chunk (memory follows the tokens kept); "
                                          "all decodes each video whole, ahead of the model. The records do not "
                                          "depend on it."),
    keyframes: bool = typer.Option(False, "--keyframes", rich_help_panel="Frames",
                                   help="Feed the key frame nearest each of the protocol's frames instead of the "
                                        "frame itself: faster, but not the benchmark's protocol (recorded in the "
                                        "run's config; a run is resumed only with the same choice)."),
    engine: str = typer.Option("ottvid", "--engine", metavar="ENGINE", rich_help_panel="Engine",
                               help="Who answers: ottvid (its own engine) or vllm (an in-process vLLM engine per "
                                    "setting, with ottvid's plugin: Qwen2.5-VL and Qwen3-VL; needs the [vllm] extra). "
                                    "The same frames, prompts, parsers and records."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", metavar="N", rich_help_panel="Engine",
                                             help="vLLM: GPUs each engine spans (tensor parallel)."),
    engine_arg: list[str] = typer.Option(None, "--engine-arg", metavar="KEY=VALUE", rich_help_panel="Engine",
                                         help="vLLM: another vllm.LLM argument, VALUE as JSON where it parses (repeat), "
                                              "e.g. max_model_len=32768, gpu_memory_utilization=0.85."),
    chunk: int = typer.Option(64, "--chunk", min=1, metavar="N", rich_help_panel="Engine",
                              help="vLLM: requests handed to the engine at once (it batches them; their records "
                                   "are written when they are done)."),
    **options,
) -> None:
    """Evaluate on a benchmark with the paper's protocol: one record per sample and setting, resumable."""
    from ..eval import EngineStartError, EvalError, EvalRequest, RunStopped, StoreError, score_run
    from ..eval import table as runs_table

    as_json, quiet = options.pop("as_json"), options.pop("quiet")  # the rest: model, preset, device, dtype, ...
    request = EvalRequest(  # as given: `_evaluate` settles the model, device, dtype and ratio
        bench=bench, data=data, videos=videos, methods=method or ["ottvid"], ratios=ratio or [], frames=frames,
        fps=fps, max_frames=max_frames, limit=limit, out=out_dir, shard=shard, skip_missing=skip_missing,
        retry_errors=retry_errors, sampling=sampling_rule, prefetch=prefetch, compare=compare, max_pixels=max_pixels,
        keyframes=keyframes, chunk_frames=chunk_frames or "all", engine=engine,
        tensor_parallel_size=tensor_parallel_size, engine_args=engine_arg or [], chunk=chunk, **options)

    try:
        if table:
            _show_table(runs_table(table), as_json)
            return
        if rescore is not None:
            summary = score_run(rescore, compare, data)
            if not as_json:
                _say_rejudged(summary["rejudged"])
            _show(summary, as_json)
            return
        _evaluate(request, as_json, quiet)
    except RunStopped as exc:  # Ctrl-C or SIGTERM: the records written are kept
        fail(str(exc), code=143 if exc.terminated else 130)
    except EvalError as exc:
        fail(str(exc))
    except (StoreError, EngineStartError) as exc:  # a record could not be written, vLLM did not start: kept
        fail(str(exc), code=EXIT_RUN)


# ----------------------------------------------------------------------------- the run


def _evaluate(request: EvalRequest, as_json: bool, quiet: bool) -> None:
    """Check, run and render one evaluation (`ottvid_cli.eval.evaluate`) of `request`, as given (its model,
    device, dtype and ratios settled here; its engine_args still --engine-arg's KEY=VALUE items): progress
    on stderr, the summary on stdout (rank 0 only under torchrun)."""
    from dataclasses import replace

    from ..eval import evaluate, parse_engine_args, plan_run

    bench = request.bench
    if bench is None:
        fail("give a benchmark (see `ottvid eval --help`), or --rescore RUN")
    engine_args = parse_engine_args(request.engine_args)
    model, device, dtype, default_ratio, _ = settle(request.model, request.device, request.dtype, None, None, None,
                                                    config_frames=False)
    if request.engine == "vllm":  # vLLM picks its device: only a --device given is refused (check_engine)
        device = request.device
    plan = plan_run(replace(request, model=model, device=device, dtype=dtype,
                            ratios=request.ratios or [default_ratio], engine_args=engine_args))
    silent = quiet or plan.rank > 0 and plan.distributed

    def load(rank_device: str):
        progress = Progress(silent)
        backbone = load_model(ModelChoice(model, rank_device, dtype, request.attention, request.max_pixels,
                                          request.siglip_head), progress)
        progress.stop()
        return backbone

    bar = _Bar(quiet, f"{bench} shard {plan.rank}/{plan.shards}" if plan.shards > 1 else bench)
    try:
        outcome = evaluate(plan, load, on_start=None if quiet else _say_start, on_progress=bar,
                           call=lambda work: run(work, Progress(True)))
    finally:
        bar.stop()
    stats = outcome.stats
    if stats is not None and 0 < stats.errors < stats.records and not quiet:
        err.print(f"{stats.errors} of {stats.records} records hold an error", highlight=False)
    if outcome.waiting and not quiet:
        err.print(f"shard {plan.rank}/{plan.shards} done; {outcome.waiting} records of other shards remain (the last "
                  f"shard to finish merges and scores, or run `ottvid eval --rescore {plan.out}`)", highlight=False)
    if outcome.unmerged and not quiet:
        err.print(f"not merged yet: {outcome.unmerged}", highlight=False, markup=False)
    if outcome.summary is None:
        return
    _show(outcome.summary, as_json, failed_run=True)
    _fail_if_nothing_evaluated(outcome.summary, plan.out)


def _say_start(start: RunStart) -> None:
    """What the run folder held before the model loads: nothing left to run (scored as it is), or the
    records of an earlier run of the same settings, which this one resumes."""
    if not start.left:
        err.print(f"every sample of {start.out} has its records already: scoring them (no model loaded; "
                  f"--retry-errors runs the failed ones again)", highlight=False, markup=False, soft_wrap=True)
    elif start.kept:
        err.print(f"resuming {start.out}: {start.done} of {start.samples} samples done already ({start.kept} records "
                  f"kept, {start.left} to run)", highlight=False, markup=False, soft_wrap=True)


def _say_rejudged(changes: list[dict]) -> None:
    """--rescore: how many verdicts changed per setting."""
    for change in changes:
        method = change["method"]
        setting = "none" if method == "none" else f"{method} {_ratio(method, change['ratio'])}"
        out.print(f"{setting}: {change['changed']} of {change['records']} verdicts changed "
                  f"({change['scores_changed']} scores)", highlight=False, markup=False)


def _fail_if_nothing_evaluated(summary: dict, out_dir) -> None:
    """A run in which no sample could be evaluated (every record holds an error) exits 1 with one
    line; the records are kept."""
    results = summary["results"]
    records = sum(r["count"] for r in results)
    if records and all(r["errors"] == r["count"] for r in results):
        fail(f"no sample could be evaluated: all {records} records hold an error (kept in {out_dir}; see the "
              f"`error` field in samples.jsonl)", code=EXIT_RUN)


# ----------------------------------------------------------------------------- rendering


def _console():
    """stdout for a table: the terminal, or a console as wide as any table needs in a pipe or a file."""
    from .layout import table_console

    return table_console(out)


def _print_table(table) -> None:
    """`table` within the terminal's width, every score whole (`report.split_table`)."""
    from .layout import print_table

    print_table(_console(), table, keys=2)  # method and ratio name each row


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

    for row in table["rows"]:
        values = [_number(row["scores"][label] if label is not None else row["average"][family])
                  for _, family, label in cells]
        view.add_row(row["method"], _ratio(row["method"], row["ratio"]), *values)
    _print_table(view)


def _number(value: float | None) -> str:
    """A score or a % in a table: one decimal, "-" for none."""
    return "-" if value is None else f"{value:.1f}"


def _ratio(method: str, ratio: float) -> str:
    """The share of visual tokens kept, as a %: 100% for vanilla."""
    return "100%" if method == "none" else f"{ratio * 100:g}%"


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
        row = [result["method"], _ratio(result["method"], result["ratio"]), str(result["count"]), str(result["errors"])]
        row += [_number(result["metrics"].get(n)) for n in names]
        if "relative" in result:
            row.append(_number(result["relative"]))
        table.add_row(*row)
    console = _console()
    _print_table(table)
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
        err.print(f"{self.label}: {p.done}/{p.total} {p.unit}{errors}, {rate or '-'}{eta}", highlight=False,
                  markup=False)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
