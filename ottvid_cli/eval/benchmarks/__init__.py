"""Benchmark readers: the official annotation files -> a list of `Sample`s, and where each video lives.

Each reader accepts the format the benchmark publishes (see docs/eval.md for the layouts and the
fields read). Bad input raises `EvalError` (a ValueError) with one line naming the file and the
line or record at fault.

One module a reader (mvbench, videomme, longvideobench, mlvu, charades, activitynet, timelens, jsonl),
over `files` (reading annotation files and their fields) and `samples` (`Sample`, `EvalError`);
`videos` finds each sample's video. This module names the readers (`READERS`) and loads a benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .activitynet import read_activitynet
from .charades import read_charades
from .jsonl import read_jsonl
from .longvideobench import read_longvideobench
from .mlvu import read_mlvu
from .mvbench import read_mvbench
from .samples import GROUNDING, MC, EvalError, Sample
from .timelens import read_timelens
from .videomme import read_videomme
from .videos import VideoFinder, VideoRef, find_video, missing_videos

READERS: dict[str, Callable[[Path], list[Sample]]] = {
    "mvbench": read_mvbench,
    "videomme": read_videomme,
    "longvideobench": read_longvideobench,
    "mlvu": read_mlvu,
    "charades": read_charades,
    "activitynet": read_activitynet,
    "timelens": read_timelens,
    "jsonl": read_jsonl,
}
BENCHMARKS = tuple(READERS)


def check_benchmark(name: str) -> str:
    if name not in READERS:
        raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return name


def load_samples(benchmark: str, path: Path | str) -> list[Sample]:
    """Every sample of `benchmark` in the annotation file (or folder) `path`, in file order."""
    path = Path(path)
    check_benchmark(benchmark)
    if not path.exists():
        raise EvalError(f"{path}: annotation file not found")
    samples = READERS[benchmark](path)
    if not samples:
        raise EvalError(f"{path}: no samples")
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EvalError(f"{path}: sample id {dup!r} occurs twice")
    return samples


__all__ = ["BENCHMARKS", "GROUNDING", "MC", "READERS", "EvalError", "Sample", "VideoFinder", "VideoRef",
           "check_benchmark", "find_video", "load_samples", "missing_videos"]
