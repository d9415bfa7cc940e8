"""OUT/summary.json, rebuilt from the record files alone: per (method, ratio) the counts and metrics
(`summarise`), read from a run folder (`score`) and written (`rescore`, `write_summary`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from .atomic import write_atomic
from .benchmarks import EvalError
from .errors import StoreError, one_line
from .record_files import load_records
from .run_config import CONFIG, load_config
from .scoring import VANILLA, headline, metrics, relative

SUMMARY = "summary.json"


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def summarise(records: Iterable[dict], benchmark: str, model: str) -> dict:
    """summary.json: per (method, ratio), vanilla first: how many records, how many errors (left out
    of the metrics), how many replies held no answer, the metrics in percent, and `relative` (the
    headline metric as % of vanilla's) when vanilla ran."""
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["method"], round(float(record["ratio"]), 6))].append(record)
    results = []
    for (method, ratio), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != VANILLA, kv[0][0], -kv[0][1])):
        ok = [r for r in rs if r.get("error") is None]
        results.append({
            "method": method, "ratio": ratio, "count": len(rs), "errors": len(rs) - len(ok),
            "unparsed": sum(1 for r in ok if not r.get("parsed", True)), "metrics": metrics(benchmark, rs),
        })
    vanilla = next((r for r in results if r["method"] == VANILLA and r["count"] > r["errors"]), None)
    if vanilla is not None:
        name = headline(vanilla["metrics"])
        for result in results:
            result["relative"] = relative(result["metrics"].get(name, 0.0), vanilla["metrics"][name])
    for result in results:
        result["metrics"] = {k: _round(v) for k, v in result["metrics"].items()}
        if "relative" in result:
            result["relative"] = _round(result["relative"])
    return {"benchmark": benchmark, "model": model, "results": results}


def write_summary(out_dir: Path | str, summary: dict) -> Path:
    path = Path(out_dir) / SUMMARY
    try:
        write_atomic(path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {one_line(exc)} (the records are kept)") from None
    return path


def score(out_dir: Path | str) -> tuple[dict, dict]:
    """(summary, config) of a run folder from its record files alone (benchmark and model from
    config.json, else from the records; config {} without one); nothing is written. A folder without
    records is an EvalError."""
    out = Path(out_dir)
    records = load_records(out)
    config = load_config(out) if (out / CONFIG).exists() else {}
    if not records:
        what = "config.json but no sample records yet" if config else "no sample records and no config.json"
        raise EvalError(f"{out}: {what}")
    benchmark = config.get("benchmark") or records[0].get("benchmark")
    if not benchmark:
        raise EvalError(f"{out}: no config.json and no benchmark in the records")
    return summarise(records, benchmark, config.get("model", "")), config


def rescore(out_dir: Path | str) -> dict:
    """Rebuild OUT/summary.json from the record files alone (`score`) and return it. A folder without
    records is an error (an existing summary.json is left as it is)."""
    summary, _ = score(out_dir)
    write_summary(out_dir, summary)
    return summary
