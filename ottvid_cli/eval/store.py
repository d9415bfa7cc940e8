"""The record store: `SampleStore`, the append-only record file one shard writes, and `RecordLock`, its
writer's lock. Runs survive being killed: one JSONL record per (sample, method, ratio), the run's
config, shards, their merge, and the summary rebuilt from the records alone.

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

The run folder's other parts: the records themselves (records.py), reading the record files back
(record_files.py), locks (locking.py), atomic writes (atomic.py), shards and their merge (shards.py),
config.json (run_config.py), summary.json (summary.py), replies judged again (rejudging.py), and the
errors (errors.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from .atomic import fsync_dir, write_atomic
from .benchmarks import EvalError, Sample
from .errors import StoreError, one_line
from .locking import acquire, lock_file, release
from .record_files import has_error, read_records, snapshot
from .records import Key, key_of, record_key
from .shards import record_file


def _append(fd: int, data: bytes) -> None:
    """Write all of `data` (os.write may write part of it: a signal, a nearly full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
        if retry_errors and any(has_error(r) for r in own):
            own = [r for r in own if not has_error(r)]
            write_atomic(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in own))
        self._done: set[Key] = {key_of(r) for r in own}
        for _, records in snapshot(self.out, skip=self.path):
            self._done.update(key_of(r) for r in records if not (retry_errors and has_error(r)))
        created = not self.path.exists()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EvalError(f"{self.path}: cannot write: {one_line(exc)}") from None
        if created:
            fsync_dir(self.out)

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
        key = key_of(record)
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
