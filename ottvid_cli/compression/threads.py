"""One CPU thread for compression's small ops: the Sinkhorn iterations, the greedy selection's steps and
the element-wise rest of the other stages. The matrix products (the Gram and cost matrices) keep every
thread.

On the CPU, a PyTorch op over more than about 32k elements runs as an OpenMP parallel region over every
intra-op thread and returns when the slowest thread is done. The Sinkhorn loop and the greedy selection
run hundreds of such ops one after the other, each of tens to hundreds of microseconds. On a quiet
machine a region costs a few microseconds more than its work; beside another process that keeps the
same cores busy (a vLLM CPU server, whose OpenMP threads are bound to them; a decoder), one thread of
the team is often descheduled, and each region then waits for it to run again: milliseconds, a region
(docs/method.md, "CPU threads", has the measurements). `serial` runs such a block on the calling
thread alone.

The results are the same bit for bit (tests/test_cpu_threads.py compares them at both settings): the
ops inside split their work across threads by output elements, so each output is computed by one
thread, in the same order, at any thread count.

What changes is `torch.get_num_threads()` of the calling thread, restored on leaving (exceptions
included). With PyTorch's OpenMP backend (every standard build) that count is the calling thread's
own: other threads keep theirs. torch also makes it the count that a thread running its first PyTorch
op afterwards starts with, so a thread whose first op falls inside the block starts with one thread.
Nothing changes for tensors off the CPU, for ops of more than `SERIAL_ELEMENTS` elements, for a thread
that already runs one thread, with other threading backends (PyTorch's native pool: one count shared
by every thread), or where the process has replaced `torch.set_num_threads` to keep its count fixed
(vLLM's CPU worker does, once it has bound its OpenMP threads to cores).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import torch

# Blocks whose ops hold up to this many elements run on one thread (32 MB of float32: about a
# millisecond of work an op at most, what one wait for a descheduled thread can cost). At the
# shapes benchmarks/compression.py measures up to 64 groups, that is every stage but the two
# matrix products; longer calls keep every thread for their largest ops.
SERIAL_ELEMENTS = 1 << 23


def serial(device: torch.device, elements: int) -> ContextManager[None]:
    """Run the block on the calling thread alone when `device` is the CPU and its ops hold at most
    `SERIAL_ELEMENTS` elements (see the module's docstring); else change nothing."""
    if torch.device(device).type != "cpu" or elements > SERIAL_ELEMENTS or not scoped_threads():
        return nullcontext()
    return _one_thread()


@contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def scoped_threads() -> bool:
    """Whether the thread count can be set for the calling thread alone: the OpenMP backend, and
    `torch.set_num_threads` still PyTorch's own."""
    return torch.set_num_threads is torch._C.set_num_threads and _openmp()


@functools.cache
def _openmp() -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()
