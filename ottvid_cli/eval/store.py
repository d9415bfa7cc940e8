"""Runs that survive being killed: one JSONL record per (sample, method, ratio), the run's config,
shards, their merge, and the summary rebuilt from the records alone.

OUT/
  config.json                  the run's settings; a resume with other settings is refused
  samples.jsonl                the records (unsharded, or after `merge_shards`)
  samples.<rank>-of-<n>.jsonl  one shard's records while sharded
  summary.json                 `summarise` / `rescore`
  samples.jsonl.bak            the record file as it was before the first `rejudge` changed it (kept once)
  .<record file>.lock          held by the process writing that record file (never deleted)
  .run.lock                    held briefly while config.json is updated or the shard files are merged

A record file has one writer at a time: `SampleStore` holds an exclusive lock (`flock`) on its
lock file, so a second identical run is refused with one line instead of writing every record
twice. A failed write (disk full, a signal) is cut back off the file, so a line is either whole or
absent.
"""

from __future__ import annotations

import errno
import json
import os
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from .benchmarks import GROUNDING, MC, EvalError, Sample
from .scoring import VANILLA, headline, judge, metrics, relative, target_for

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
GROWABLE = ("methods", "ratios")  # config keys a resume may extend
UPDATABLE = ("limit", "skip_missing", "samples")  # config keys a resume may change (the last value is kept)
PER_KIND = ("sampling",)  # {kind: ...}: a resume may add kinds (a new --limit reaches other samples), not change one
RUN_LOCK = ".run.lock"
_SHARD_FILE = re.compile(r"^samples\.(\d+)-of-(\d+)\.jsonl$")

Key = tuple[str, str, float]


def record_key(sample_id: str, method: str, ratio: float) -> Key:
    return str(sample_id), str(method), round(float(ratio), 6)


def _key_of(record: dict) -> Key:
    return record_key(record["id"], record["method"], record["ratio"])


def _valid(record: Any) -> dict:
    """`record` if it is a sample record: a key, and a numeric score unless it holds an error
    (what the summary reads); ValueError, KeyError or TypeError if not."""
    if not isinstance(record, dict):
        raise TypeError("not an object")
    _key_of(record)
    if record.get("error") is None and not isinstance(record.get("score"), (int, float)):
        raise ValueError("no score")
    return record


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


def changed_samples(records: Iterable[dict], samples: Sequence[Sample]) -> list[str]:
    """Ids of `samples` whose records were made from other annotations or prompts than those they
    have now (the file edited, or ottvid's prompt for the benchmark changed since the run): the
    record's prompt or target differs. A resume that mixed them would score two versions of a question."""
    from .prompts import build_prompt

    by_id = {s.id: s for s in samples}
    changed: dict[str, None] = {}
    for record in records:
        sample = by_id.get(record.get("id"))
        if sample is None or record["id"] in changed:
            continue
        prompt = record.get("prompt")
        target = target_for(sample, record.get("duration"))
        recorded = tuple(record["target"]) if isinstance(record.get("target"), list) else record.get("target")
        if (prompt is not None and prompt != build_prompt(sample)) or recorded != (
                tuple(target) if isinstance(target, list) else target):
            changed[record["id"]] = None
    return list(changed)


def unknown_samples(records: Iterable[dict], samples: Sequence[Sample]) -> list[str]:
    """Ids of records whose sample is not in `samples` (the whole annotation file): a record of
    another set, or inserted by hand, that a resume or a rescore would otherwise count."""
    known = {s.id for s in samples}
    return list(dict.fromkeys(str(r["id"]) for r in records if str(r["id"]) not in known))


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
                    _write_atomic(backup, path.read_text(encoding="utf-8"))
                _write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))
            except OSError as exc:
                raise StoreError(f"cannot write {path}: {one_line(exc)} (the records are as they were)") from None
    finally:
        for key in reversed(held):
            release(key)
        release(folder)
    counted = {id(r) for r in _unique(old for old, _ in pairs)}
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


# ----------------------------------------------------------------------------- locks


class StoreError(Exception):
    """A record could not be written (disk full, permissions): the run stops, what was written is kept.
    Not a ValueError, so it is never mistaken for a sample's own failure or for bad input."""


class RunInUse(EvalError):
    """Another process holds the lock of a record file of the run folder."""


try:
    import fcntl
except ImportError:  # not POSIX: no locking (one writer per run folder is then the user's business)
    fcntl = None

_NO_LOCKS = {getattr(errno, name) for name in ("ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS") if hasattr(errno, name)}
_HELD: dict[str, list] = {}  # lock file -> [fd, count]: locks this process holds (re-entrant)


def lock_file(path: Path) -> Path:
    """The lock file guarding record file `path` (a separate file: `path` itself is replaced by merges)."""
    return path.with_name(f".{path.name}.lock")


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text(encoding="utf-8").strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid.isdigit() else ""


def acquire(lock: Path, *, wait: bool = False, what: str | None = None) -> str:
    """Take the exclusive lock `lock` (re-entrant within this process); RunInUse when another process
    holds it and not `wait`. Returns the key to pass to `release`."""
    key = str(lock.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    if lock.parent.exists() and not lock.parent.is_dir():
        raise EvalError(f"{lock.parent}: not a folder (the run folder must be one)")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EvalError(f"{lock.parent}: cannot write to the run folder: {one_line(exc)}") from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in _NO_LOCKS:  # a file system without locks (some NFS mounts): run unguarded, as without fcntl
                _HELD[key] = [fd, 1]
                return key
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise EvalError(f"{lock}: cannot lock: {one_line(exc)}") from None
            raise RunInUse(f"{what or lock} is being written by another run{_holder(lock)}: wait for it to "
                           "finish, or use another --out") from None
        try:  # who holds it, for the message another process shows
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
    _HELD[key] = [fd, 1]
    return key


def release(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[key]
        os.close(held[0])  # closing the descriptor drops the flock


def _append(fd: int, data: bytes) -> None:
    """Write all of `data` (os.write may write part of it: a signal, a nearly full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def record_file(out_dir: Path | str, rank: int = 0, shards: int = 1) -> Path:
    """The record file shard `rank` of `shards` writes: OUT/samples.jsonl unsharded."""
    _check_shard(rank, shards)
    return Path(out_dir) / (SAMPLES if shards == 1 else f"samples.{rank}-of-{shards}.jsonl")


class RecordLock:
    """Hold the writer's lock of shard `rank` of `shards` in OUT (as `SampleStore` does), e.g. from
    before the model loads until the run ends, so a second run of the same shard is refused early."""

    def __init__(self, out_dir: Path | str, rank: int = 0, shards: int = 1):
        path = record_file(out_dir, rank, shards)
        self._key: str | None = acquire(lock_file(path), what=path)

    def release(self) -> None:
        if self._key is not None:
            release(self._key)
            self._key = None

    def __enter__(self) -> "RecordLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


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
            tail_record = _valid(json.loads(tail))
            whole_tail = True
        except (ValueError, KeyError, TypeError):
            pass
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = _valid(json.loads(line))
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


def _failed(record: dict) -> bool:
    return record.get("error") is not None


def _snapshot(out_dir: Path | str, skip: Path | None = None) -> list[tuple[Path, list[dict]]]:
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


def _unique(records: Iterable[dict]) -> list[dict]:
    """Each (id, method, ratio) once: the first record without an error, else the first (a retried
    sample's new record supersedes its error record in another file)."""
    chosen: dict[Key, int] = {}
    out: list[dict] = []
    for record in records:
        key = _key_of(record)
        n = chosen.get(key)
        if n is None:
            chosen[key] = len(out)
            out.append(record)
        elif _failed(out[n]) and not _failed(record):
            out[n] = record
    return out


def load_records(out_dir: Path | str) -> list[dict]:
    """Every record of the run, merged file first, each (id, method, ratio) once (one without an
    error where there is one)."""
    return _unique(r for _, records in _snapshot(out_dir) for r in records)


class SampleStore:
    """The append-only record file of one shard (or of the whole run when `shards` is 1).

    Opening it takes the file's lock (`RunInUse` when another process writes it), repairs a torn
    last line of its own file and learns what is done from every record file in OUT (any shard
    count), so a resumed or re-sharded run skips finished work. `add` writes one line with one
    write, fsync'd, and never writes a (id, method, ratio) twice; a failed write is cut back off
    and raises `StoreError`. With `retry_errors`, error records count as not done: those of its own
    file are dropped, those of other files are superseded by the new records (`load_records`,
    `merge_shards` prefer a record without an error).
    """

    def __init__(self, out_dir: Path | str, *, rank: int = 0, shards: int = 1, retry_errors: bool = False):
        self.out = Path(out_dir)
        self.path = record_file(self.out, rank, shards)
        if self.out.exists() and not self.out.is_dir():
            raise EvalError(f"{self.out}: not a folder")
        self._fd: int | None = None
        self._lock = RecordLock(self.out, rank, shards)
        try:
            self._open(retry_errors)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, retry_errors: bool) -> None:
        own = read_records(self.path, repair=True)
        if retry_errors and any(_failed(r) for r in own):
            own = [r for r in own if not _failed(r)]
            _write_atomic(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in own))
        self._done: set[Key] = {_key_of(r) for r in own}
        for _, records in _snapshot(self.out, skip=self.path):
            self._done.update(_key_of(r) for r in records if not (retry_errors and _failed(r)))
        created = not self.path.exists()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EvalError(f"{self.path}: cannot write: {one_line(exc)}") from None
        if created:
            _fsync_dir(self.out)

    def __enter__(self) -> "SampleStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._lock.release()

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
        """Append the record (fsync'd); False, writing nothing, if its key is done. If the write
        fails or is interrupted, what reached the file is cut off again (StoreError for a failure)."""
        key = _key_of(record)
        if key in self._done:
            return False
        if self._fd is None:
            raise StoreError(f"{self.path}: the record store is closed")
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        size = os.fstat(self._fd).st_size  # the lock: no one else appends meanwhile
        try:
            _append(self._fd, data)
            os.fsync(self._fd)
        except BaseException as exc:
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                pass  # the torn line is cut off when the file is next opened
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write {self.path}: {one_line(exc)}") from None
            raise
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
    """Fold the shard files into OUT/samples.jsonl (each key once, a record without an error
    preferred, written atomically), then delete them unless `keep`. Run it once every shard has
    finished. Merges are serialised (OUT/.run.lock); RunInUse, merging nothing, when another process
    still writes one of the record files (that run merges when it ends)."""
    out = Path(out_dir)
    target = out / SAMPLES
    merge = acquire(out / RUN_LOCK, wait=True)
    held: list[str] = []
    try:
        files = [p for p in sample_files(out) if p != target]
        for path in [target, *files]:
            held.append(acquire(lock_file(path), what=path))
        records = _unique(r for _, rs in _snapshot(out) for r in rs)
        try:
            _write_atomic(target, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {one_line(exc)} (the shard files are kept)") from None
        if not keep:
            for path in files:  # only those locked (and so read): a shard file begun since is not ours
                path.unlink(missing_ok=True)
            _fsync_dir(out)
    finally:
        for key in reversed(held):
            release(key)
        release(merge)
    return target


# ----------------------------------------------------------------------------- config


def save_config(out_dir: Path | str, config: dict) -> dict:
    """Write OUT/config.json, or check a resume against it. Only `methods` and `ratios` may change
    (the stored lists grow to the union), `limit` / `skip_missing` / `samples` (the new value is
    stored) and `sampling` may gain kinds of sample (a new --limit reaching grounding samples); any
    other difference is refused with a one-line EvalError. One process at a time (OUT/.run.lock), so
    shards adding methods at the same moment do not lose each other's."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"{out}: cannot make the run folder: {one_line(exc)}") from None
    folder = acquire(out / RUN_LOCK, wait=True)  # shards starting together: one read-modify-write at a time
    try:
        return _save_config(out / CONFIG, config)
    finally:
        release(folder)


def _save_config(path: Path, config: dict) -> dict:
    config = json.loads(json.dumps(config))  # normalise tuples, paths
    if path.exists():
        old = _absolute_folders(_read_config(path), config)
        differences = config_differences(old, config)
        if differences:
            raise EvalError(f"{path}: this folder holds a run with other settings ({'; '.join(differences)}): use "
                            "another output folder or the same settings (only methods and ratios may be added)")
        for key in PER_KIND:
            mine, theirs = config.get(key), old.get(key)
            if isinstance(mine, dict) and isinstance(theirs, dict):
                config[key] = {**theirs, **mine}
        for key in GROWABLE:
            merged = list(old.get(key) or [])
            merged += [v for v in config.get(key) or [] if v not in merged]
            config[key] = merged
    try:
        _write_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise EvalError(f"{path}: cannot write: {one_line(exc)}") from None
    return config


_SAME_AS = {"pixels": "max_pixels"}  # a per-kind sampling entry that follows a setting of the run


def _shown(value: Any) -> str:
    """A config value as a person reads it: unset, yes / no, a list without brackets, a plain string."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(v) for v in value) or "none"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def config_differences(old: dict, config: dict) -> list[str]:
    """What a resume with `config` would change in the run `old` records and may not: one
    'setting X there, Y now' per setting (the kinds' sampling entries that follow from a setting
    already named are left out; kinds only one of them has are no difference)."""
    found, named = [], set()
    for key in sorted(set(old) | set(config)):
        if key not in GROWABLE + UPDATABLE + PER_KIND and old.get(key) != config.get(key):
            found.append(f"{key} {_shown(old.get(key))} there, {_shown(config.get(key))} now")
            named.add(key)
    for key in PER_KIND:
        mine, theirs = config.get(key), old.get(key)
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            continue
        for kind in sorted(set(mine) & set(theirs)):
            before, now = theirs[kind], mine[kind]
            if not (isinstance(before, dict) and isinstance(now, dict)):
                if before != now:
                    found.append(f"{key} of {kind} samples {_shown(before)} there, {_shown(now)} now")
                continue
            for entry in sorted(set(before) | set(now)):
                if before.get(entry) != now.get(entry) and _SAME_AS.get(entry, entry) not in named:
                    found.append(f"{key} {entry} of {kind} samples {_shown(before.get(entry))} there, "
                                 f"{_shown(now.get(entry))} now")
    return found


def _absolute_folders(old: dict, config: dict) -> dict:
    """`old` with a model or SigLIP folder recorded by its relative name (runs written before folders
    were recorded resolved) taken as the absolute path `config` records, when it names that folder
    from here: resuming such a run from where it was started is not "another model"."""
    old = dict(old)
    for key in ("model", "siglip_head"):
        before, now = old.get(key), config.get(key)
        if (isinstance(before, str) and isinstance(now, str) and before != now and os.path.isabs(now)
                and not os.path.isabs(before) and os.path.isdir(before) and Path(before).resolve() == Path(now)):
            old[key] = now
    return old


def _read_config(path: Path) -> dict:
    """OUT/config.json as a dict; an unreadable file, bad JSON or JSON that is not an object is a
    one-line EvalError."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalError(f"{path}: unreadable run config: {one_line(exc)}") from None
    if not isinstance(config, dict):
        what = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(config), "a number")
        raise EvalError(f"{path}: unreadable run config: a JSON object was expected, not {what}")
    return config


def load_config(out_dir: Path | str) -> dict:
    path = Path(out_dir) / CONFIG
    if not path.exists():
        raise EvalError(f"{path}: no run config here")
    return _read_config(path)


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
    try:
        _write_atomic(path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
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
