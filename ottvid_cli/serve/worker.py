"""The model worker: one thread owns the engine (and so the model) and runs one job at a time, in
arrival order, from a bounded queue. It first runs the engine's warm-up (`ready` then turns true;
jobs that arrive meanwhile wait in the queue).

A full queue refuses new work at once (`QueueFull`; the app answers 503 with Retry-After). A job
whose client went away or timed out is cancelled: taken out of the queue if it has not started, or
stopped at its next step or generated token if it has (the engine's `on_step` / `on_token` raise).
A failing job (a video that does not decode, not enough memory, anything else) becomes an error for
its own request only; the worker goes on with the next job and the model stays loaded.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .security import ApiError, Media

log = logging.getLogger("ottvid.serve")

OOM_MESSAGE = ("not enough memory for this request: ask for fewer frames or a smaller ratio (the model is still "
               "loaded; other requests are served)")


UPLOAD = "the uploaded video"


class QueueFull(Exception):
    """No room in the queue; `retry_after` is a guess of the seconds until there is."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy: retry in about {retry_after} s")
        self.retry_after = retry_after


class _Cancelled(Exception):
    """Raised from the engine's callbacks to stop a job nobody waits for any more."""


@dataclass(eq=False)
class Job:
    """One request for the worker. Its events arrive on `events` (an asyncio queue of the loop that
    made it): ("token", text) while generating (when `stream`), then ("done", the run's dict) or
    ("error", ApiError)."""

    task: str  # "ask" | "ground"
    media: Media
    text: str
    run: dict[str, Any]  # sampling, method, ratio, preset, max_new_tokens (+ options for ask)
    stream: bool = False
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop, repr=False)
    events: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def emit(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody listens
            pass


class ModelWorker:
    """The single thread that calls the engine. `submit` queues (or raises QueueFull), `cancel`
    withdraws, `stop` ends the thread after the job in flight."""

    def __init__(self, engine: Any, max_queue: int = 16):
        self.engine = engine
        self.max_queue = max_queue
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._current: Job | None = None
        self._seconds = 1.0  # running average of a job's duration, for Retry-After
        self.served = 0
        self.warmup_ms: float | None = None  # the warm-up's time, once it ran (None: none or not yet)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ottvid-model-worker", daemon=True)

    # -- the event loop's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return self._current is not None

    @property
    def ready(self) -> bool:
        """Whether the warm-up has run (the first request is then not a cold one)."""
        return self._ready.is_set()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(max(1, round(self._seconds * (len(self._pending) + 1))))
            self._pending.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Nobody waits for this job any more: drop it from the queue, or stop it where it runs."""
        job.cancelled.set()
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                return  # running (it stops at its next step) or finished
        job.media.cleanup()

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, answer the queued ones with 503, let the one in flight finish, end the thread."""
        with self._cond:
            self._stopping = True
            left = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for job in left:
            job.media.cleanup()
            job.emit("error", ApiError(503, "the server is shutting down", code="shutting_down"))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the worker thread's side ----------------------------------------------------------------

    def _warm_up(self) -> None:
        """One small request through the model before any job (`Engine.warm_up`; an engine without one
        is ready at once). A failing warm-up only leaves the first request cold: logged, then ready."""
        warm = getattr(self.engine, "warm_up", None)
        try:
            if warm is not None:
                self.warmup_ms = warm()
                log.info("warm-up: %.0f ms", self.warmup_ms)
        except Exception as exc:  # noqa: BLE001 - never the server's end; requests are served cold
            log.warning("the warm-up failed (%s: %s); the first request will be a cold one", type(exc).__name__, exc)
        finally:
            self._ready.set()

    def _loop(self) -> None:
        self._warm_up()
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if not self._pending:
                    return
                job = self._current = self._pending.popleft()
            start = time.perf_counter()
            try:
                self._run(job)
            finally:
                job.media.cleanup()
                self._current = None
                self._seconds = 0.8 * self._seconds + 0.2 * (time.perf_counter() - start)
                self.served += 1

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            return

        def step(_name: str = "") -> None:
            if job.cancelled.is_set():
                raise _Cancelled

        def token(piece: str) -> None:
            step()
            if piece and job.stream:
                job.emit("token", piece)

        call = self.engine.ask if job.task == "ask" else self.engine.ground
        try:
            result = call(job.media.path, job.text, on_token=token, on_step=step, **job.run)
            data = result.to_dict()
            data["cache_hit"] = bool(data.get("cache_hit", getattr(result, "cache_hit", False)))
            if job.media.temporary:
                data["video"] = UPLOAD  # not the private temporary file's name
            job.emit("done", data)
        except _Cancelled:
            log.info("request cancelled: its client went away or timed out")
        except Exception as exc:  # noqa: BLE001 - every failure is this request's error, never the server's end
            error = error_for(exc)
            if job.media.temporary:
                error.message = error.message.replace(job.media.path, UPLOAD)
            job.emit("error", error)


def error_for(exc: BaseException) -> ApiError:
    """The API error for a failed run: bad input 400; not enough memory, or a model failure, 500."""
    import torch

    from ..settings import ModelError
    from ..video import VideoError

    oom = (getattr(torch, "OutOfMemoryError", ()), MemoryError)
    if isinstance(exc, oom) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()):
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return ApiError(500, OOM_MESSAGE, code="out_of_memory")
    if isinstance(exc, VideoError):
        return ApiError(400, str(exc), code="invalid_video", param="messages")
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, ModelError):
        return ApiError(500, str(exc), code="model_error")
    log.exception("the run failed", exc_info=exc)
    return ApiError(500, f"the run failed: {type(exc).__name__}: {exc}", code="internal_error")
