"""Stored replies judged again by today's parsers: `rejudge_record` (one record) and `rejudge` (every
record file of a run folder rewritten where a verdict changed, its first version kept as NAME.bak).
"""

from __future__ import annotations

import json
from pathlib import Path

from .atomic import write_atomic
from .benchmarks import GROUNDING, MC, Sample
from .errors import StoreError, one_line
from .locking import RUN_LOCK, acquire, lock_file, release
from .record_files import read_records, sample_files, unique_records
from .scoring import VANILLA, judge


def _sample_of(record: dict, benchmark: str | None = None) -> Sample:
    """The sample a record was made from, as far as judging it needs: its benchmark, kind, options
    (their letters), id (LongVideoBench's seeded fallback) and the target it was run against."""
    kind = record.get("kind") or MC
    target = record.get("target")
    if kind == GROUNDING and isinstance(target, list):
        target = tuple(target)
    return Sample(id=str(record["id"]), benchmark=record.get("benchmark") or benchmark or "", kind=kind,
                  video=str(record.get("video") or ""), question=str(record.get("question") or ""), target=target,
                  options=tuple(record.get("options") or ()), category=record.get("category"),
                  subset=record.get("subset"))


def rejudge_record(record: dict, benchmark: str | None = None) -> dict:
    """The record with its reply parsed and scored again by today's `judge` (prediction, score,
    parsed), against the target it was run with; a record holding an error is returned as it is."""
    if record.get("error") is not None or not isinstance(record.get("reply"), str):
        return record
    verdict = judge(_sample_of(record, benchmark), record["reply"], record.get("duration"))
    return {**record, "prediction": verdict.prediction, "score": verdict.score, "parsed": verdict.parsed}


def backup_file(path: Path) -> Path:
    """Where `rejudge` keeps a record file as it was before it first changed it: NAME.bak."""
    return path.with_name(path.name + ".bak")


def rejudge(out_dir: Path | str, benchmark: str | None = None) -> list[dict]:
    """Re-judge every stored reply of the run with today's parsers (`rejudge_record`) and rewrite each
    record file whose verdicts changed, atomically, after keeping its first version as NAME.bak (once:
    a later rejudge keeps the oldest). Holds the folder's lock and every record file's (RunInUse while
    a run writes one). Returns, per (method, ratio), vanilla first: how many records (each key once,
    as the summary counts them), how many verdicts (prediction or score) changed and how many scores."""
    out = Path(out_dir)
    folder = acquire(out / RUN_LOCK, wait=True)
    held: list[str] = []
    try:
        files = sample_files(out)
        for path in files:
            held.append(acquire(lock_file(path), what=path))
        pairs: list[tuple[dict, dict]] = []
        for path in files:
            old = read_records(path)
            new = [rejudge_record(r, benchmark) for r in old]
            pairs += zip(old, new)
            if new == old:
                continue
            backup = backup_file(path)
            try:
                if not backup.exists():
                    write_atomic(backup, path.read_text(encoding="utf-8"))
                write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))
            except OSError as exc:
                raise StoreError(f"cannot write {path}: {one_line(exc)} (the records are as they were)") from None
    finally:
        for key in reversed(held):
            release(key)
        release(folder)
    counted = {id(r) for r in unique_records(old for old, _ in pairs)}
    groups: dict[tuple[str, float], dict] = {}
    for old, new in pairs:
        if id(old) not in counted:
            continue
        setting = (str(old["method"]), round(float(old["ratio"]), 6))
        group = groups.setdefault(setting, {"method": setting[0], "ratio": setting[1], "records": 0, "changed": 0,
                                            "scores_changed": 0})
        group["records"] += 1
        group["changed"] += (new.get("prediction"), new.get("score")) != (old.get("prediction"), old.get("score"))
        group["scores_changed"] += new.get("score") != old.get("score")
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0] != VANILLA, k[0], -k[1]))]
