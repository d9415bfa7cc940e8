"""A run folder's results without a model: its replies judged again (`score_run`), its scores as % of
another run's vanilla (`compare`), and Table 1 over the runs of one model (`table`). Nothing prints:
each returns the summary or table as a dict."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .benchmarks import EvalError, load_samples
from .record_files import load_records
from .records import unknown_samples
from .rejudging import rejudge
from .run_config import CONFIG, load_config
from .scoring import VANILLA, headline, paper_table, relative
from .summary import rescore, score, write_summary


def vanilla_of(other: Path | str, benchmark: str) -> dict:
    """The vanilla (method none) result of run folder `other`, a `benchmark` run (EvalError if not)."""
    if not Path(other).is_dir():
        raise EvalError(f"{other}: run folder to compare with not found")
    theirs, _ = score(other)
    if theirs["benchmark"] != benchmark:
        raise EvalError(f"{other}: a {theirs['benchmark']} run cannot be compared with a {benchmark} one")
    vanilla = next((r for r in theirs["results"] if r["method"] == VANILLA and r["count"] > r["errors"]), None)
    if vanilla is None:
        raise EvalError(f"{other}: no vanilla (method none) results to compare with")
    return vanilla


def compare(summary: dict, other: Path | str) -> dict:
    """`summary` with `relative` (% of run folder `other`'s vanilla headline score) on each result and
    `relative_to` naming `other`."""
    vanilla = vanilla_of(other, summary["benchmark"])
    name = headline(vanilla["metrics"])
    for result in summary["results"]:
        value = relative(result["metrics"].get(name, 0.0), vanilla["metrics"][name])
        result["relative"] = round(value, 4) if value is not None else None
    summary["relative_to"] = str(other)
    return summary


def check_members(run: Path | str, records: Sequence[dict], benchmark: str, data: Path | str) -> None:
    """Every record is of a sample of the annotation file `data` (EvalError naming the first that is not)."""
    if not Path(data).exists():
        raise EvalError(f"{data}: the run's annotation file is not there (config.json's data): give --data FILE "
                        "to check the records against it")
    unknown = unknown_samples(records, load_samples(benchmark, data))
    if unknown:
        raise EvalError(f"{run}: {len(unknown)} records are of samples that {data} does not hold (first: "
                        f"{unknown[0]}): remove them from the record files, or use the annotation file of the run")


def score_run(run: Path | str, compare_with: Path | str | None = None, data: Path | str | None = None) -> dict:
    """Judge every stored reply of run folder RUN again and rebuild RUN/summary.json: records of samples
    the run's annotation file (config.json's `data`, or `data`) does not hold are refused first
    (EvalError). The summary comes back with `rejudged` (per setting: how many verdicts changed,
    `rejudging.rejudge`), `out`, and with `compare_with`, each result's `relative` to that run's vanilla."""
    if not Path(run).is_dir():
        raise EvalError(f"{run}: run folder not found")
    config = load_config(run) if (Path(run) / CONFIG).exists() else {}
    records = load_records(run)
    benchmark = config.get("benchmark") or (records[0].get("benchmark") if records else None)
    data = data or config.get("data")
    if records and data and benchmark:
        check_members(run, records, benchmark, data)
    changes = rejudge(run, benchmark) if records else []
    summary = rescore(run)
    if compare_with is not None:
        summary = compare(summary, compare_with)
        write_summary(run, summary)
    summary["out"] = str(run)
    summary["rejudged"] = changes
    return summary


def table(runs: Sequence[Path | str]) -> dict:
    """Table 1 over run folders (their records, scored afresh; nothing is written): one column per
    run, named by its benchmark (and its annotation file's stem where two runs share a benchmark).
    The runs must be of one model; `model` and `runs` are added to `scoring.paper_table`'s dict."""
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
    result["runs"] = [str(run) for run in runs]
    return result
