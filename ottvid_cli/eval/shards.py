"""Shards: which samples a shard runs (a checksum of the id), the record file it writes, and
`merge_shards`, which folds the shard files into OUT/samples.jsonl.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Sequence

from .atomic import fsync_dir, write_atomic
from .benchmarks import EvalError, Sample
from .errors import StoreError, one_line
from .locking import RUN_LOCK, acquire, lock_file, release
from .record_files import SAMPLES, sample_files, snapshot, unique_records


def check_shard(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise EvalError(f"shard {index} of {count}: need 0 <= shard < shards and shards >= 1")


def shard_of(sample_id: str, count: int) -> int:
    """The shard a sample belongs to: a checksum of its id, so it never depends on file order."""
    return zlib.crc32(str(sample_id).encode("utf-8")) % count


def shard(samples: Sequence[Sample], index: int, count: int) -> list[Sample]:
    """The samples of shard `index` out of `count` (disjoint, together all of them, deterministic)."""
    check_shard(index, count)
    return [s for s in samples if shard_of(s.id, count) == index]


def record_file(out_dir: Path | str, rank: int = 0, shards: int = 1) -> Path:
    """The record file shard `rank` of `shards` writes: OUT/samples.jsonl unsharded."""
    check_shard(rank, shards)
    return Path(out_dir) / (SAMPLES if shards == 1 else f"samples.{rank}-of-{shards}.jsonl")


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
        records = unique_records(r for _, rs in snapshot(out) for r in rs)
        try:
            write_atomic(target, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {one_line(exc)} (the shard files are kept)") from None
        if not keep:
            for path in files:  # only those locked (and so read): a shard file begun since is not ours
                path.unlink(missing_ok=True)
            fsync_dir(out)
    finally:
        for key in reversed(held):
            release(key)
        release(merge)
    return target
