"""Runs that survive being killed: one JSONL record per (sample, method, ratio), the run's config,
shards, their merge, and the summary rebuilt from the records alone.

OUT/
  config.json                  the run's settings; a resume with other settings is refused
  samples.jsonl                the records (unsharded, or after `merge_shards`)
  samples.<rank>-of-<n>.jsonl  one shard's records while sharded
  summary.json                 `summarise` / `rescore`
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from .benchmarks import GROUNDING, EvalError, Sample
from .scoring import VANILLA, headline, judge, metrics, relative, target_for

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
GROWABLE = ("methods", "ratios")  # config keys a resume may extend
UPDATABLE = ("limit", "skip_missing")  # config keys a resume may change (the last run's value is kept)
_SHARD_FILE = re.compile(r"^samples\.(\d+)-of-(\d+)\.jsonl$")

Key = tuple[str, str, float]


def record_key(sample_id: str, method: str, ratio: float) -> Key:
    return str(sample_id), str(method), round(float(ratio), 6)


def _key_of(record: dict) -> Key:
    return record_key(record["id"], record["method"], record["ratio"])


def one_line(error: BaseException | str) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:500]


def make_record(sample: Sample, method: str, ratio: float, reply: str | None = None, *,
                error: BaseException | str | None = None, duration: float | None = None,
                video: str | os.PathLike | None = None, tokens: dict | None = None,
                timings_ms: dict | None = None, prompt: str | None = None) -> dict:
    """The record of one run of `sample` with (method, ratio): its reply parsed and scored, or the
    error that stopped it (score null; errors are left out of the metrics and counted apart).
    `duration` (s, of the decoded video) clips Charades-STA targets; `video` is the path used."""
    if error is None and reply is None:
        raise ValueError("make_record needs a reply or an error")
    if error is None:
        verdict = judge(sample, reply, duration)
        prediction, target, score, parsed = verdict.prediction, verdict.target, verdict.score, verdict.parsed
    else:
        prediction, target, score, parsed = None, target_for(sample, duration), None, False
    record = {
        "id": sample.id, "benchmark": sample.benchmark, "kind": sample.kind,
        "video": str(video if video is not None else sample.video), "question": sample.question,
        "options": list(sample.options), "category": sample.category, "subset": sample.subset,
        "prompt": prompt, "reply": reply, "prediction": prediction, "target": target, "score": score,
        "parsed": parsed, "method": method, "ratio": float(ratio),
        "error": None if error is None else one_line(error), "tokens": tokens, "timings_ms": timings_ms,
    }
    if sample.kind == GROUNDING:
        record["duration"] = duration
    return record


# ----------------------------------------------------------------------------- JSONL files


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # shards may write at the same time
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def read_records(path: Path, *, repair: bool = False) -> list[dict]:
    """The complete records of a JSONL file. A last line cut short by a kill (no newline, or not
    JSON) is ignored, and with `repair` cut off the file; a bad line before the last is an error."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    good_end = len(data) - len(tail)
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            _key_of(record)
        except (ValueError, KeyError, TypeError):
            if n == len(lines):  # a torn last line that happens to end in a newline
                good_end -= len(line) + 1
                break
            raise EvalError(f"{path}: line {n}: not a sample record (the file is damaged)") from None
        records.append(record)
    if repair and good_end != len(data):
        with open(path, "r+b") as f:
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


def load_records(out_dir: Path | str) -> list[dict]:
    """Every record of the run, merged file first, each (id, method, ratio) once."""
    seen: set[Key] = set()
    out = []
    for path in sample_files(out_dir):
        for record in read_records(path):
            key = _key_of(record)
            if key not in seen:
                seen.add(key)
                out.append(record)
    return out


class SampleStore:
    """The append-only record file of one shard (or of the whole run when `shards` is 1).

    Opening it repairs a torn last line of its own file and learns what is done from every record
    file in OUT (any shard count), so a resumed or re-sharded run skips finished work. `add` writes
    one line, flushed and fsync'd, and never writes a (id, method, ratio) twice. With
    `retry_errors`, the error records of its own file are dropped so those samples run again.
    """

    def __init__(self, out_dir: Path | str, *, rank: int = 0, shards: int = 1, retry_errors: bool = False):
        _check_shard(rank, shards)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / (SAMPLES if shards == 1 else f"samples.{rank}-of-{shards}.jsonl")
        own = read_records(self.path, repair=True)
        if retry_errors and any(r.get("error") is not None for r in own):
            own = [r for r in own if r.get("error") is None]
            _write_atomic(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in own))
        self._done: set[Key] = {_key_of(r) for r in own}
        for path in sample_files(self.out):
            if path != self.path:
                self._done.update(_key_of(r) for r in read_records(path))
        created = not self.path.exists()
        self._file = open(self.path, "a", encoding="utf-8")
        if created:
            _fsync_dir(self.out)

    def __enter__(self) -> "SampleStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __len__(self) -> int:
        return len(self._done)

    def done(self, sample_id: str, method: str, ratio: float) -> bool:
        return record_key(sample_id, method, ratio) in self._done

    def todo(self, samples: Iterable[Sample], runs: Sequence[tuple[str, float]]
             ) -> list[tuple[Sample, list[tuple[str, float]]]]:
        """Each sample with the (method, ratio) runs it still needs, in order; finished samples are
        left out. One decode/encode of a sample can serve all of its runs."""
        out = []
        for sample in samples:
            left = [(m, r) for m, r in runs if not self.done(sample.id, m, r)]
            if left:
                out.append((sample, left))
        return out

    def add(self, record: dict) -> bool:
        """Append the record (flushed and fsync'd); False, writing nothing, if its key is done."""
        key = _key_of(record)
        if key in self._done:
            return False
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._done.add(key)
        return True


# ----------------------------------------------------------------------------- shards


def _check_shard(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise EvalError(f"shard {index} of {count}: need 0 <= shard < shards and shards >= 1")


def shard_of(sample_id: str, count: int) -> int:
    """The shard a sample belongs to: a checksum of its id, so it never depends on file order."""
    return zlib.crc32(str(sample_id).encode("utf-8")) % count


def shard(samples: Sequence[Sample], index: int, count: int) -> list[Sample]:
    """The samples of shard `index` out of `count` (disjoint, together all of them, deterministic)."""
    _check_shard(index, count)
    return [s for s in samples if shard_of(s.id, count) == index]


def merge_shards(out_dir: Path | str, *, keep: bool = False) -> Path:
    """Fold the shard files into OUT/samples.jsonl (each key once, written atomically), then delete
    them unless `keep`. Run it once every shard has finished."""
    out = Path(out_dir)
    records = load_records(out)
    target = out / SAMPLES
    _write_atomic(target, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    if not keep:
        for path in sample_files(out):
            if path != target:
                path.unlink()
        _fsync_dir(out)
    return target


# ----------------------------------------------------------------------------- config


def save_config(out_dir: Path | str, config: dict) -> dict:
    """Write OUT/config.json, or check a resume against it. Only `methods` and `ratios` may change
    (the stored lists grow to the union) and `limit` / `skip_missing` (the new value is stored); any
    other difference is refused with a one-line EvalError."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG
    config = json.loads(json.dumps(config))  # normalise tuples, paths
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EvalError(f"{path}: unreadable run config: {one_line(exc)}") from None
        for key in sorted(set(old) | set(config)):
            if key not in GROWABLE + UPDATABLE and old.get(key) != config.get(key):
                raise EvalError(
                    f"{path}: this folder holds a run with {key}={old.get(key)!r}, not {config.get(key)!r}; "
                    "use another output folder or the same settings (only methods and ratios may be added)"
                )
        for key in GROWABLE:
            merged = list(old.get(key) or [])
            merged += [v for v in config.get(key) or [] if v not in merged]
            config[key] = merged
    _write_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return config


def load_config(out_dir: Path | str) -> dict:
    path = Path(out_dir) / CONFIG
    if not path.exists():
        raise EvalError(f"{path}: no run config here")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EvalError(f"{path}: unreadable run config: {one_line(exc)}") from None


# ----------------------------------------------------------------------------- summary


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
    _write_atomic(path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return path


def rescore(out_dir: Path | str) -> dict:
    """Rebuild OUT/summary.json from the record files alone (benchmark and model from config.json,
    else from the records) and return it."""
    out = Path(out_dir)
    records = load_records(out)
    config = load_config(out) if (out / CONFIG).exists() else {}
    benchmark = config.get("benchmark") or (records[0]["benchmark"] if records else None)
    if benchmark is None:
        raise EvalError(f"{out}: no records and no config.json to rescore")
    summary = summarise(records, benchmark, config.get("model", ""))
    write_summary(out, summary)
    return summary
