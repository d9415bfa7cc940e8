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
    """Time of named steps in ms (`with watch("step"): ...`); repeated names add up.

    On CUDA a step is timed with CUDA events recorded on the current stream around it (the host
    waits for the end event once, at the end of the step); elsewhere with perf_counter after
    synchronising the device. `ms` is the dict of results; pass one in to collect into it.
    """

    def __init__(self, device: torch.device, ms: dict[str, float] | None = None):
        self.device = torch.device(device)
        self.ms: dict[str, float] = {} if ms is None else ms

    def __call__(self, name: str) -> "_Lap":
        return _Lap(self, name)


class _Lap:
    def __init__(self, watch: Stopwatch, name: str):
        self.watch, self.name = watch, name

    def __enter__(self) -> None:
        if self.watch.device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        else:
            synchronize(self.watch.device)
            self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.watch.device.type == "cuda":
            self.events[1].record()
            self.events[1].synchronize()
            elapsed = self.events[0].elapsed_time(self.events[1])
        else:
            synchronize(self.watch.device)
            elapsed = (time.perf_counter() - self.start) * 1e3
        self.watch.ms[self.name] = self.watch.ms.get(self.name, 0.0) + elapsed
