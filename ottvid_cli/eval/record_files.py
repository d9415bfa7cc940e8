"""The record files of a run folder (OUT/samples.jsonl, OUT/samples.<rank>-of-<n>.jsonl) read back:
whole lines only (a line cut short by a kill is dropped, and with `repair` cut off), a damaged line
refused by number, every file read as one consistent snapshot, each record key once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable

from .benchmarks import EvalError
from .errors import one_line
from .records import Key, key_of, valid_record

SAMPLES = "samples.jsonl"
_SHARD_FILE = re.compile(r"^samples\.(\d+)-of-(\d+)\.jsonl$")


def read_records(path: Path, *, repair: bool = False) -> list[dict]:
    """The complete records of a JSONL file. A last line without its newline was cut short by a kill
    (a write puts the newline last): it is ignored, and with `repair` cut off the file, unless it is
    a whole record that lacks only its newline (kept, and with `repair` the newline added). Any
    complete line (newline-terminated) that is not a record is an error naming its line, the last
    one included: it is never silently dropped."""
    records = _read(path, repair=repair)
    return [] if records is None else records


def _read(path: Path, *, repair: bool = False) -> list[dict] | None:
    """read_records, but None when the file is not there (a merge may just have folded it in)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EvalError(f"{path}: cannot read: {one_line(exc)}") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    good_end = len(data) - len(tail)
    whole_tail = False
    if tail.strip():  # no newline after it: cut short by a kill, unless it is a whole record
        try:
            tail_record = valid_record(json.loads(tail))
            whole_tail = True
        except (ValueError, KeyError, TypeError):
            pass
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = valid_record(json.loads(line))
        except (ValueError, KeyError, TypeError):
            raise EvalError(f"{path}: line {n}: not a sample record (the file is damaged; remove or mend that "
                            "line, and its sample runs again)") from None
        records.append(record)
    if whole_tail:
        records.append(tail_record)
    if repair and (good_end != len(data) or whole_tail):
        with open(path, "r+b") as f:
            if whole_tail:  # keep it: only its newline is missing
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            else:
                f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return records


def sample_files(out_dir: Path | str) -> list[Path]:
    """OUT/samples.jsonl (if any), then the shard files in (n, rank) order."""
    out = Path(out_dir)
    shards = []
    for path in out.glob("samples.*-of-*.jsonl"):
        match = _SHARD_FILE.match(path.name)
        if match:
            shards.append(((int(match.group(2)), int(match.group(1))), path))
    merged = [out / SAMPLES] if (out / SAMPLES).exists() else []
    return merged + [p for _, p in sorted(shards)]


def has_error(record: dict) -> bool:
    return record.get("error") is not None


def snapshot(out_dir: Path | str, skip: Path | None = None) -> list[tuple[Path, list[dict]]]:
    """Every record file of OUT (but `skip`) with its records. A file that vanishes while read was
    folded into samples.jsonl by a merge (written before the shard files go): read them all again."""
    for _ in range(100):
        files = []
        for path in sample_files(out_dir):
            if path == skip:
                continue
            records = _read(path)
            if records is None:
                break
            files.append((path, records))
        else:
            return files
    raise EvalError(f"{out_dir}: the record files keep changing while read")


def unique_records(records: Iterable[dict]) -> list[dict]:
    """Each (id, method, ratio) once: the first record without an error, else the first (a retried
    sample's new record supersedes its error record in another file)."""
    chosen: dict[Key, int] = {}
    out: list[dict] = []
    for record in records:
        key = key_of(record)
        n = chosen.get(key)
        if n is None:
            chosen[key] = len(out)
            out.append(record)
        elif has_error(out[n]) and not has_error(record):
            out[n] = record
    return out


def load_records(out_dir: Path | str) -> list[dict]:
    """Every record of the run, merged file first, each (id, method, ratio) once (one without an
    error where there is one)."""
    return unique_records(r for _, records in snapshot(out_dir) for r in records)
