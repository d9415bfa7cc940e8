"""Load the next videos while the model works on this one.

Decoding a video runs on the CPU (seeking through a long file: seconds), the model on its device;
`ahead` runs a load function for the next `depth` items in background threads so that, on a GPU,
the decoding of video i+1 overlaps the encoding, compression and generation of video i. The
decoders (decord, PyAV) release the GIL while they decode. Results come back in the items' order;
a load that raises hands its exception back with its item (the caller records it), it does not stop
the others. At most `depth` results are held (or being made) at a time, so memory stays bounded:
`depth` decoded clips beyond the one in use.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable, Iterable, Iterator, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def default_depth(device) -> int:
    """How many videos to load ahead when none is asked for: 1 on an accelerator, 0 on the CPU, where
    the loader would only compete with the model for the same cores."""
    return 0 if device.type == "cpu" else 1


def ahead(items: Iterable[Item], load: Callable[[Item], Result], depth: int = 1
          ) -> Iterator[tuple[Item, Result | None, BaseException | None]]:
    """(item, load(item), None) or (item, None, the exception) for each item, in order; with
    `depth` >= 1 the loads of the next `depth` items run in as many background threads while the
    caller works on the current one; `depth` 0 loads each item when it is reached (no thread).
    Closing the iterator early (break, an exception in the caller) cancels the loads not started;
    a running one finishes in its daemon thread, unwaited (an exit does not wait for it either)."""
    if depth <= 0:
        for item in items:
            try:
                yield item, load(item), None
            except Exception as exc:  # noqa: BLE001 - handed back to the caller with its item
                yield item, None, exc
        return
    source = iter(items)
    pending: deque[tuple[Item, Future]] = deque()

    def fill() -> None:
        while len(pending) < depth:
            try:
                item = next(source)
            except StopIteration:
                return
            pending.append((item, _start(load, item)))

    try:
        fill()
        while pending:
            item, future = pending.popleft()
            fill()  # while the caller works on this item, the next `depth` load
            try:
                result, error = future.result(), None
            except Exception as exc:  # noqa: BLE001
                result, error = None, exc
            yield item, result, error
            del result
    finally:
        for _, future in pending:
            future.cancel()


def _start(load: Callable[[Item], Result], item: Item) -> Future:
    """load(item) in a daemon thread (a Ctrl-C or an exit does not wait for a decode to end)."""
    future: Future = Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(load(item))
        except BaseException as exc:  # noqa: BLE001 - re-raised by future.result() in the caller
            future.set_exception(exc)

    threading.Thread(target=work, name="ottvid-load", daemon=True).start()
    return future
