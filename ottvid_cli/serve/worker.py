"""The model worker: one thread owns the engine (and so the model) and runs one job at a time, in
arrival order, from a bounded queue. It first runs the engine's warm-up (`ready` then turns true;
jobs that arrive meanwhile wait in the queue).

A full queue refuses new work at once (`QueueFull`; the app answers 503 with Retry-After: the jobs
ahead times the mean duration of the last jobs run). A job whose client went away or timed out is
cancelled: taken out of the queue if it has not started, or stopped at its next cancellation point
if it has (the engine's `on_step` / `on_token` raise; the job's `cancelled` event, passed as `cancel`,
stops the engine's long loops: hashing the video, decoding it, Sinkhorn's iterations).
A failing job (a video that does not decode, not enough memory, anything else) becomes an error for
its own request only; the worker goes on with the next job and the model stays loaded.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..blame import raised_by_ottvid
from ..interrupt import Interrupted
from ..request import Request as RunRequest
from .security import ApiError, Media

log = logging.getLogger("ottvid.serve")

OOM_MESSAGE = ("not enough memory for this request: ask for fewer frames or a smaller ratio (the model is still "
               "loaded; other requests are served)")

INTERNAL_MESSAGE = "internal error (the details are in the server's log)"
RECENT = 20  # jobs whose durations make the Retry-After estimate


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
    request: RunRequest  # the frames, compression, reply length (+ choices for ask, point for ground)
    stream: bool = False
    picture: bool = False  # also draw the `show` picture (ottvid.picture)
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
        self._started = 0.0  # when the job in flight began (perf_counter)
        self._durations: collections.deque[float] = collections.deque(maxlen=RECENT)  # of jobs that ran
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
                raise QueueFull(self.retry_after())
            self._pending.append(job)
            self._cond.notify()

    def retry_after(self) -> int:
        """Seconds until a place in the queue frees up, roughly: every queued job and the one in flight
        take the mean duration of the last jobs run (before any has finished: as long as the one in
        flight has taken so far), less what the one in flight has already run."""
        now = time.perf_counter()
        elapsed = now - self._started if self._current is not None else 0.0
        mean = sum(self._durations) / len(self._durations) if self._durations else max(elapsed, 1.0)
        ahead = len(self._pending) * mean + max(mean - elapsed, 0.0)
        return max(1, round(ahead))

    def cancel(self, job: Job) -> None:
        """Nobody waits for this job any more: drop it from the queue, or stop it where it runs."""
        job.cancelled.set()
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                return  # running (it stops at its next step) or finished
        job.media.cleanup()

    def stop(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, answer the queued ones with 503, cancel the one in flight (the server calls
        this once its requests have ended: nobody waits for it), and wait up to `timeout` seconds for
        the thread to end. False if it is still running then (a call that does not return: the thread
        is a daemon, so it does not keep the process alive)."""
        with self._cond:
            self._stopping = True
            left = list(self._pending)
            self._pending.clear()
            current = self._current
            self._cond.notify_all()
        if current is not None:
            current.cancelled.set()
        for job in left:
            job.media.cleanup()
            job.emit("error", ApiError(503, "the server is shutting down", code="shutting_down"))
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

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
                self._started = time.perf_counter()
            ran = False
            try:
                ran = self._run(job)
            finally:
                job.media.cleanup()
                if ran:
                    self._durations.append(time.perf_counter() - self._started)
                self._current = None
                self.served += 1

    def _run(self, job: Job) -> bool:
        """Run the job and emit its result; False if it was cancelled before it began."""
        if job.cancelled.is_set():
            return False

        def step(_name: str = "") -> None:
            if job.cancelled.is_set():
                raise _Cancelled

        def token(piece: str) -> None:
            step()
            if piece and job.stream:
                job.emit("token", piece)

        call = self.engine.ask if job.task == "ask" else self.engine.ground
        try:
            # the decoder reads media.path (/proc/self/fd/N, an upload's temporary file); the result and
            # a disk-cache entry written now name the real file, or no file for an upload
            result = call(job.media.path, job.text, request=job.request, on_token=token, on_step=step,
                          cancel=job.cancelled, video_name=job.media.real)
            data = result.to_dict()
            for once in ("load", "warmup"):  # the server's start-up, not this request's: /health gives them
                data.get("timings_ms", {}).pop(once, None)
            data["cache_hit"] = bool(data.get("cache_hit", getattr(result, "cache_hit", False)))
            # what this request named: never the file the decoder read (an upload's temporary file,
            # /proc/self/fd/N) nor, on a cache hit, the name of whoever prepared the video first
            data["video"] = job.media.name
            if job.picture:
                title = job.media.name if job.media.temporary else os.path.basename(job.media.name)
                data["picture"] = picture_of(result, data, title)
            job.emit("done", data)
        except (_Cancelled, Interrupted):
            log.info("request cancelled: its client went away or timed out")
        except Exception as exc:  # noqa: BLE001 - every failure is this request's error, never the server's end
            error = error_for(exc)
            error.message = error.message.replace(job.media.path, job.media.name)
            job.emit("error", error)
        finally:
            _log_cache_warnings(self.engine)
        return True


def _log_cache_warnings(engine: Any) -> None:
    """The disk cache's warnings (a damaged entry rebuilt, a folder that cannot be written) into the
    server's log, one line each: the CLI prints them, a server has no terminal to print them on."""
    take = getattr(getattr(engine, "cache", None), "take_warnings", None)
    for line in take() if take is not None else ():
        log.warning("cache: %s", line)


def picture_of(result: Any, data: dict[str, Any], name: str | None = None) -> dict[str, Any] | None:
    """`ottvid.picture`: the `show` picture of the run as a PNG data: URL (`image`) with what `show
    --json` reports (width, height, tiles, kept, ...); None for method none (nothing was compressed).
    Its drawing time is `timings_ms.picture`."""
    import base64

    from ..pipeline import drawing
    from ..show import picture_png

    prepared = getattr(result, "prepared", None)
    if prepared is None or getattr(prepared, "compressed", None) is None:
        return None
    start = time.perf_counter()
    try:
        png, info = picture_png(drawing(prepared), name=name)
    except ValueError as exc:  # nothing to draw: the answer still goes out
        return {"image": None, "error": str(exc)}
    data.setdefault("timings_ms", {})["picture"] = (time.perf_counter() - start) * 1000
    return {"image": "data:image/png;base64," + base64.b64encode(png).decode("ascii"), **info}


def error_for(exc: BaseException) -> ApiError:
    """The API error for a failed run: bad input 400; not enough memory, or a model failure, 500."""
    import torch

    from ..model_source import ModelError
    from ..video import VideoError

    oom = (getattr(torch, "OutOfMemoryError", ()), MemoryError)
    said = str(exc).lower()
    if isinstance(exc, oom) or (isinstance(exc, RuntimeError) and ("out of memory" in said
                                                                   or "can't allocate memory" in said)):
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return ApiError(500, OOM_MESSAGE, code="out_of_memory")
    if isinstance(exc, VideoError):
        return ApiError(400, str(exc), code="invalid_video", param="messages")
    if isinstance(exc, ValueError) and raised_by_ottvid(exc):  # our one-line message about the request
        return ApiError(400, str(exc), code="invalid_value")
    log.error("the run failed", exc_info=exc)  # the details stay here: a 500 tells the client nothing internal
    return ApiError(500, INTERNAL_MESSAGE, code="model_error" if isinstance(exc, ModelError) else "internal_error")


