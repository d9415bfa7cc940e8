"""The FastAPI app of `ottvid serve`: OpenAI's chat-completions API over one loaded model.

    POST /v1/chat/completions   messages with a `video_url` part and text; `stream: true` for
                                server-sent events; our settings in the `ottvid` body field
    GET  /v1/models             the one model served
    GET  /health                readiness (503 until the warm-up request ran), queue length, the start-up's
                                load and warm-up times (no API key needed)
    GET  /                      the page for people, and its /v1/ottvid/* endpoints (page.py)

Every error is OpenAI's `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status;
none ends the server. docs/serve.md is the reference.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, format_sse_event
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..checks import DEFAULT_MAX_FRAMES, MAX_SINKHORN_ITER
from ..request import Compression
from ..request import Request as RunRequest
from .schema import DEFAULT_TOKENS, MAX_NEW_TOKENS, ChatCompletion, ChatRequest, ErrorResponse, Message, ModelCard, ModelList, usage_of
from .security import ApiError, HostCheck, MediaPolicy, require_key
from .page import add_page
from .worker import INTERNAL_MESSAGE, Job, ModelWorker, QueueFull

MAX_PROMPT_CHARS = 16384  # the question and its choices, in characters (about 4k tokens): --max-prompt-chars
WORKER_GRACE = 10.0  # seconds the model's thread has at shutdown, once the requests in flight have ended
log = logging.getLogger("ottvid.serve")


@dataclass(frozen=True)
class ServeSettings:
    """What `ottvid serve`'s flags set."""

    model_id: str
    api_key: str | None = None
    allowed_media_dir: str | None = None
    max_upload_mb: float = 100.0
    max_queue: int = 16
    timeout: float = 300.0  # seconds per request, queueing included
    max_pixels: int | None = None
    decoder: str = "auto"
    max_prompt_chars: int = MAX_PROMPT_CHARS
    max_request_frames: int = DEFAULT_MAX_FRAMES  # frames one request may sample: --max-request-frames
    max_sinkhorn_iter: int = MAX_SINKHORN_ITER  # a request's `max_iter` method option at most
    host: str = "127.0.0.1"  # the address listened on: a name here is one the server answers to
    allowed_hosts: tuple[str, ...] = ()  # more names for the Host header (--allowed-host; "*": any)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))


ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 413, 421, 500, 503, 504)}


def create_app(engine: Any, settings: ServeSettings) -> FastAPI:
    """The app serving `engine` (a `session.Engine`, or anything with its `ask` / `ground`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        upload_dir = tempfile.mkdtemp(prefix="ottvid-serve-")  # mode 0700: uploads are private
        app.state.media = MediaPolicy(settings.allowed_media_dir, settings.max_upload_bytes, upload_dir)
        app.state.worker = ModelWorker(engine, settings.max_queue)
        app.state.worker.start()
        try:
            yield
        finally:  # uvicorn has let the requests in flight finish (or time out) by now
            if not await run_in_threadpool(app.state.worker.stop, WORKER_GRACE):
                log.warning("the model's thread did not stop within %g s of the shutdown (a call that does not "
                            "return); exiting without it", WORKER_GRACE)
            shutil.rmtree(upload_dir, ignore_errors=True)

    # a base64 video is 4/3 of its size; 1 MiB more for the rest of the JSON. A body that declares a
    # larger size is refused at once; FastAPI's own limit on the route stops a body that declares none
    # (chunked) as it arrives
    limit = settings.max_upload_bytes * 4 // 3 + (1 << 20)
    # no interactive /docs: Swagger UI's script would come from a CDN onto the origin that holds the page's
    # API key; the schema itself stays at /openapi.json
    app = FastAPI(title="ottvid serve", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(_DeclaredSizeLimit, limit=limit)
    app.add_middleware(HostCheck, names=(settings.host, *settings.allowed_hosts))  # outermost: first to run
    app.state.settings = settings
    app.state.engine = engine
    app.state.started = int(time.time())
    _add_error_handlers(app)
    add_page(app)

    @app.get("/health")
    async def health(request: Request, response: Response) -> dict[str, Any]:
        worker: ModelWorker = request.app.state.worker
        if not worker.ready:  # 503 until the model has run its warm-up request
            response.status_code = 503
        return {"status": "ok" if worker.ready else "warming up", "ready": worker.ready, "model": settings.model_id,
                "queued": worker.queued, "busy": worker.busy, "served": worker.served,
                "load_ms": getattr(getattr(engine, "backbone", None), "load_ms", None), "warmup_ms": worker.warmup_ms}

    @app.get("/v1/models", dependencies=[Depends(require_key)], responses=ERRORS)
    async def models(request: Request) -> ModelList:
        return ModelList(data=[ModelCard(id=settings.model_id, created=request.app.state.started)])

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)], response_model=ChatCompletion,
              responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}}, max_body_size=limit)
    async def chat_completions(body: ChatRequest, request: Request):
        job = await _job(body, request)
        worker: ModelWorker = request.app.state.worker
        deadline = asyncio.get_running_loop().time() + settings.timeout
        gone = asyncio.create_task(_disconnected(request))
        handed_over = False
        try:
            try:
                worker.submit(job)
            except QueueFull as exc:
                job.media.cleanup()
                raise ApiError(503, str(exc), code="queue_full", headers={"Retry-After": str(exc.retry_after)}) \
                    from None
            except ApiError:
                job.media.cleanup()
                raise
            reply = _Reply(body, settings.model_id)
            if body.stream:
                first = await _next(job, deadline, gone)  # a bad video is still a plain 4xx here
                if first[0] == "error":
                    raise first[1]
                handed_over = True
                return EventSourceResponse(_stream(reply, first, job, worker, deadline),
                                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            while True:
                kind, value = await _next(job, deadline, gone)
                if kind == "error":
                    raise value
                if kind == "done":
                    return reply.completion(value)
        finally:
            gone.cancel()
            if not handed_over:
                worker.cancel(job)  # a no-op once it is done

    return app


# ------------------------------------------------------------------------------------------------
# a request into a job


def _compression(options: Any, ratio: float, max_iter: int) -> Compression:
    """The request's compression: `ottvid.method_args` read by the library's one reader
    (`method_args.method_options`, as `--method-arg`), a bad one a 400, and so is a Sinkhorn iteration
    count over `max_iter` (the only option that sizes a loop beyond the frames). The engine builds its
    config for the model (`Compression.config`)."""
    from ..method_args import MethodArgError, method_options

    if not options.method_args:
        return Compression(options.method, ratio, options.preset)
    try:
        chosen = method_options([options.method], [ratio], options.preset, options.method_args)[options.method]
    except MethodArgError as exc:
        raise ApiError(400, str(exc), code="invalid_value", param="ottvid.method_args") from None
    asked = chosen.get("max_iter")
    if asked is not None and asked > max_iter:
        raise ApiError(400, f"max_iter={asked:,}: this server runs at most {max_iter:,} Sinkhorn iterations a "
                            f"request (--max-sinkhorn-iter)", code="invalid_value", param="ottvid.method_args")
    return Compression(options.method, ratio, options.preset if options.method == "ottvid" else "paper", chosen)


async def _job(body: ChatRequest, request: Request) -> Job:
    settings: ServeSettings = request.app.state.settings
    if body.model != settings.model_id:
        raise ApiError(404, f"model {body.model!r} is not served here; this server serves {settings.model_id!r} "
                            f"(GET /v1/models)", code="model_not_found", param="model")
    url, text = _video_and_text(body.messages)
    options = body.ottvid
    task = options.task
    if not text:
        raise ApiError(400, f"the {'question' if task == 'ask' else 'query'} is empty: add a text part",
                       code="empty_text", param="messages")
    length = len(text) + sum(len(choice) for choice in options.choices or ())
    if length > settings.max_prompt_chars:
        raise ApiError(400, f"the {'question' if task == 'ask' else 'query'} is {length:,} characters (choices "
                            f"included); this server takes at most {settings.max_prompt_chars:,} "
                            f"(--max-prompt-chars)", code="prompt_too_long", param="messages")
    if task == "ground":
        if options.choices:
            raise ApiError(400, "choices are for task ask, not ground", code="invalid_value", param="ottvid.choices")
        backbone = getattr(request.app.state.engine, "backbone", None)
        if backbone is not None and not getattr(backbone, "grounds", False):
            raise ApiError(400, f"task ground needs a Qwen2.5-VL model: {backbone.name} is not trained to give "
                                f"time spans", code="invalid_value", param="ottvid.task")
    elif options.point:
        raise ApiError(400, "point is for task ground, not ask", code="invalid_value", param="ottvid.point")
    for field in ("frames", "max_frames"):
        asked = getattr(options, field)
        if asked is not None and asked > settings.max_request_frames:
            raise ApiError(400, f"ottvid.{field} is {asked:,}: this server samples at most "
                                f"{settings.max_request_frames:,} frames a request (--max-request-frames)",
                           code="invalid_value", param=f"ottvid.{field}")
    try:
        sampling = options.sampling(settings.max_pixels, settings.decoder, settings.max_request_frames,
                                    getattr(getattr(request.app.state.engine, "backbone", None), "default_frames", None))
    except ValueError as exc:
        raise ApiError(400, str(exc), param="ottvid") from None
    compression = _compression(options, options.ratio if options.ratio is not None else 0.1,
                               settings.max_sinkhorn_iter)
    run = RunRequest(sampling, compression, body.max_completion_tokens or body.max_tokens or DEFAULT_TOKENS[task],
                     choices=(options.choices or None) if task == "ask" else None,
                     point=options.point if task == "ground" else False)
    media = await run_in_threadpool(request.app.state.media.resolve, url)  # an upload is decoded and written
    return Job(task=task, media=media, text=text, request=run, stream=body.stream, picture=options.picture)


def _video_and_text(messages: list[Message]) -> tuple[str, str]:
    """The one video of the conversation and the text of its last user message (earlier turns, system
    and assistant messages are not sent to the model: each request is one question about one video)."""
    videos: list[str] = []
    text = ""
    for i, message in enumerate(messages):
        if message.role != "user":
            continue
        parts = message.content
        if isinstance(parts, str) or parts is None:
            text = (parts or "").strip()
            continue
        texts = []
        for j, part in enumerate(parts):
            if part.type == "text":
                texts.append(part.text or "")
            elif part.type == "video_url" and part.video_url is not None:
                videos.append(part.video_url.url)
            else:
                raise ApiError(400, f"unsupported content part {part.type!r}: send one video_url part and text",
                               param=f"messages.{i}.content.{j}.type", code="unsupported_content")
        text = "\n".join(t.strip() for t in texts if t.strip())
    if not videos:
        raise ApiError(400, 'no video: add a content part {"type": "video_url", "video_url": {"url": ...}}',
                       param="messages", code="missing_video")
    if len(videos) > 1:
        raise ApiError(400, f"one video per request, got {len(videos)}", param="messages", code="too_many_videos")
    return videos[0], text


# ------------------------------------------------------------------------------------------------
# waiting for the worker


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (its body has been read, so only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _ClientGone(Exception):
    pass


async def _next(job: Job, deadline: float, gone: asyncio.Task | None = None) -> tuple[str, Any]:
    """The job's next event; ApiError 504 past the deadline, _ClientGone if the client left first."""
    loop = asyncio.get_running_loop()
    get = asyncio.ensure_future(job.events.get())
    waiting = {get} if gone is None else {get, gone}
    try:
        done, _ = await asyncio.wait(waiting, timeout=max(0.0, deadline - loop.time()),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():
            get.cancel()
    if get in done:
        return get.result()
    if gone is not None and gone in done:
        raise _ClientGone
    raise ApiError(504, "the request took longer than the server's --timeout", code="timeout")


class _Reply:
    """The OpenAI objects of one reply (same id and creation time throughout a stream)."""

    def __init__(self, body: ChatRequest, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.max_new_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_TOKENS[body.ottvid.task]
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def finish_reason(self, run: dict[str, Any]) -> str:
        generated = (run.get("tokens") or {}).get("generated", 0)
        return "length" if generated >= min(self.max_new_tokens, MAX_NEW_TOKENS) else "stop"

    def completion(self, run: dict[str, Any]) -> ChatCompletion:
        return ChatCompletion.model_validate({
            "id": self.id, "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": run.get("answer", "")},
                         "finish_reason": self.finish_reason(run)}],
            "usage": usage_of(run).model_dump(), "ottvid": run})

    def chunk(self, delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}
        return format_sse_event(data_str=json.dumps(data, ensure_ascii=False))


async def _stream(reply: _Reply, first: tuple[str, Any], job: Job, worker: ModelWorker,
                  deadline: float) -> AsyncIterator[bytes]:
    """The server-sent events: a role chunk, one chunk per piece of text, a last chunk with the
    finish reason and the `ottvid` object, the usage chunk if asked for, then [DONE]. An error after
    the stream began is an `{"error": ...}` event (the OpenAI client raises it). A client that leaves
    cancels this generator (Starlette), and with it the job."""
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        kind, value = first
        while True:
            if kind == "token":
                yield reply.chunk({"content": value})
            elif kind == "done":
                yield reply.chunk({}, reply.finish_reason(value), ottvid=value)
                if reply.include_usage:
                    yield reply.chunk(None, usage=usage_of(value).model_dump())
                yield format_sse_event(data_str="[DONE]")
                return
            else:
                yield format_sse_event(data_str=json.dumps(value.body()))
                return
            try:
                kind, value = await _next(job, deadline)
            except ApiError as exc:
                kind, value = "error", exc
    finally:
        worker.cancel(job)


# ------------------------------------------------------------------------------------------------
# errors: OpenAI's shape everywhere


class _DeclaredSizeLimit:
    """ASGI middleware: 413 for a request whose Content-Length is over `limit`, before reading it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = Headers(scope=scope).get("content-length", "")
            if length.isdigit() and int(length) > self.limit:
                error = ApiError(413, f"the request body is larger than the server's limit ({self.limit:,} bytes: "
                                      f"--max-upload-mb, base64)", code="upload_too_large")
                return await JSONResponse(error.body(), status_code=413)(scope, receive, send)
        await self.app(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(_ClientGone)
    async def client_gone(_request: Request, _exc: _ClientGone) -> JSONResponse:
        return JSONResponse(ApiError(499, "client closed the request", code="client_closed").body(), status_code=499)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        unread = tuple(first.get("loc", ())) == ("body",) and first.get("type") == "model_attributes_type"
        if unread and not _json_type(request.headers.get("content-type", "")):
            # FastAPI reads the body as JSON only when it says it is: a JSON body sent as text/plain or
            # as a form would otherwise be told it "must be a JSON object"
            sent = request.headers.get("content-type") or "no Content-Type"
            return await api_error(request, ApiError(415, f"send the body as JSON with Content-Type: "
                                                          f"application/json (got {sent})",
                                                     code="unsupported_media_type"))
        return await api_error(request, _validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        message = {404: "no such endpoint (POST /v1/chat/completions, GET /v1/models, GET /health)",
                   413: "the request body is larger than the server's limit (--max-upload-mb)"}.get(status, exc.detail)
        if status == 400:  # FastAPI's only 400: a JSON body it could not parse (not UTF-8, nested too deeply)
            message = "the body is not valid JSON (not UTF-8, or nested too deeply)"
        code = {400: "invalid_json", 404: "unknown_url", 405: "method_not_allowed",
                413: "upload_too_large"}.get(status)
        return await api_error(_request, ApiError(status, str(message), code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def crashed(_request: Request, exc: Exception) -> JSONResponse:  # our bug: Starlette then logs it
        return JSONResponse(ApiError(500, INTERNAL_MESSAGE, code="internal_error").body(), status_code=500)


def _json_type(content_type: str) -> bool:
    """application/json or another JSON type (application/*+json), parameters (charset) aside."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _validation_error(exc: RequestValidationError) -> ApiError:
    """Pydantic's first complaint, in one line; `param` is its place in the body (`ottvid.ratio`)."""
    errors = exc.errors()
    # our own checks (value_error) say more than a union's other members ("Input should be a valid list")
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
    # the union member a value was tried as ("list[ContentPart]") is no place in the body
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and "[" not in str(part)]
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})",
                        code="invalid_json")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "missing" and not loc:  # no body at all
        message = "the body is empty: send a JSON object with model and messages"
    elif first.get("type") == "missing":
        message = f"missing field {'.'.join(loc)}"
    elif first.get("type") == "model_attributes_type" or not loc:
        message = f"the body must be a JSON object with model and messages ({message})"
    return ApiError(400, message if not loc or message.startswith(loc[-1]) else f"{'.'.join(loc)}: {message}",
                    param=".".join(loc) or None, code="invalid_value")


def _version() -> str:
    from .. import __version__

    return __version__
