"""Sampled frames decoded by several threads at once, each with a container of its own.

The seeking decoder (`pyav._Seeker`) starts afresh at every key-frame interval that holds a sampled
frame: it seeks whenever a key frame lies between it and the next sample. The samples of one interval
(a *group*) are therefore decoded the same way whichever thread decodes them, and whatever was decoded
before: one seek to the interval, then forward. Groups are handed out in order to `workers` threads,
each with its own container and decoder; every frame is the one a single worker gives, with the same
pts (tests/test_decode_workers.py).

Measured on this project's 2-core machine (docs/video.md, "Speed"): two containers with one FFmpeg
thread each decode 1.1-1.4x as fast as one container with FFmpeg's frame threads, on sparse and dense
plans alike (frame threads wait on each other after every seek and on every reference frame).
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Callable, Iterable, Iterator

import numpy as np

MAX_AUTO_WORKERS = 4  # containers by default: each holds a decoder's reference frames (~200 MB at 4K)


def groups(keys: np.ndarray, targets: list[int], each: bool = False) -> list[list[int]]:
    """`targets` (sorted pts) split by the key-frame interval they lie in (`keys`: sorted key-frame pts),
    in order; `each`: one target a group (key frames, each decoded alone)."""
    if each:
        return [[t] for t in targets]
    bins = np.searchsorted(keys, np.asarray(targets, dtype=np.int64), side="right") if len(targets) else []
    out: list[list[int]] = []
    last = None
    for target, where in zip(targets, bins):
        if where != last:
            out.append([])
            last = where
        out[-1].append(target)
    return out


def check_workers(workers: int | None) -> None:
    """ValueError unless `workers` is None or a positive whole number."""
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"workers must be a positive whole number, got {workers!r}")


def resolve_workers(workers: int | None, groups_count: int) -> int:
    """How many threads decode: `workers` (None: one per core, at most MAX_AUTO_WORKERS), never more
    than there are groups, at least one."""
    check_workers(workers)
    wanted = workers if workers is not None else min(os.cpu_count() or 1, MAX_AUTO_WORKERS)
    return max(1, min(wanted, groups_count))


def ffmpeg_threads(workers: int) -> int:
    """FFmpeg threads per container with `workers` containers: the cores shared out (0: FFmpeg's own
    choice, one container)."""
    return 0 if workers <= 1 else max(1, (os.cpu_count() or 1) // workers)


class Stopped(Exception):
    """Another worker failed or the caller left: this one stops at its next packet."""


def run_groups(work: Iterable[list[int]], workers: int,
               decode: Callable[[Iterator[list[int]], threading.Event], bool]) -> bool:
    """Run `decode(groups, stop)` on `workers` threads sharing one iterator over `work` (each thread
    takes the next group when it is done with one); True when every call returned True. A False or an
    exception stops the others (`stop` is set; a decoder checks it per packet and raises `Stopped`);
    the first exception is raised once every thread has ended. Each thread runs in a copy of the
    caller's context, so the caller's `interrupt.stop_when` scope reaches its `checkpoint()`s; with one
    worker, `decode` runs in the caller's thread itself."""
    stop = threading.Event()
    lock = threading.Lock()
    source = iter(work)

    def shared() -> Iterator[list[int]]:
        while not stop.is_set():
            with lock:
                group = next(source, None)
            if group is None:
                return
            yield group

    def one() -> bool:
        try:
            ok = decode(shared(), stop)
        except Stopped:
            return False
        except BaseException:
            stop.set()
            raise
        if not ok:
            stop.set()
        return ok

    if workers <= 1:
        return one()
    results: list[bool] = [False] * workers
    errors: list[BaseException] = []

    def thread(i: int, context: contextvars.Context) -> None:
        try:
            results[i] = context.run(one)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            errors.append(exc)

    # daemon threads, not a pool: an exit (an error elsewhere, an interrupt) must not wait for a whole
    # decode, as a ThreadPoolExecutor's threads are waited for at exit
    threads = [threading.Thread(target=thread, args=(i, contextvars.copy_context()), name=f"ottvid-decode-{i}",
                                daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        stop.set()  # the caller left (an interrupt): the workers stop at their next packet, unwaited
    if errors:
        raise errors[0]
    return all(results)
