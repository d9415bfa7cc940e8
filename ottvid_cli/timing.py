"""Wall-clock timing of steps that may run on an accelerator."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """Wall time of named steps in ms (`with watch("step"): ...`), synchronising the device at each boundary.

    Repeated names add up. `ms` is the dict of results; pass one in to collect into it.
    """

    def __init__(self, device: torch.device, ms: dict[str, float] | None = None):
        self.device = device
        self.ms: dict[str, float] = {} if ms is None else ms

    def __call__(self, name: str) -> "_Lap":
        return _Lap(self, name)


class _Lap:
    def __init__(self, watch: Stopwatch, name: str):
        self.watch, self.name = watch, name

    def __enter__(self) -> None:
        synchronize(self.watch.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        synchronize(self.watch.device)
        self.watch.ms[self.name] = self.watch.ms.get(self.name, 0.0) + (time.perf_counter() - self.start) * 1e3
