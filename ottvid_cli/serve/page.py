"""The page of `ottvid serve` and the small endpoints it uses (docs/serve.md, "The page").

    GET /                           the page: plain HTML, CSS and a script, shipped in the package
                                    (static/), no CDN; it holds no data, so it needs no key (the
                                    script asks for the key when the server has one); HEAD too
    GET /page/{page.css,page.js}    its style and script; HEAD too
    GET /v1/ottvid/info             what the page offers: model, tasks, methods, upload cap, whether
                                    local videos are served, whether the start-up warm-up has
                                    run (ready) and its time, the model's load time
    GET /v1/ottvid/media            the videos under --allowed-media-dir (403 without the flag)
    GET /v1/ottvid/media/{name}     one of them, for the page's player (Range requests work; a
                                    malformed Range is ignored); HEAD too

The /v1 routes need the API key like the rest of /v1, and the media routes read only what
`MediaPolicy.resolve` lets a request read: after symlinks and `..` are resolved, a video file under
the folder.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from starlette.background import BackgroundTask
from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import MalformedRangeHeader

from ..method_catalog import METHODS, PRESETS
from .schema import DEFAULT_TOKENS
from .security import ApiError, Media, MediaPolicy, require_key

# the video files listed and served, with the type they are served as (not the system's guess: .ts is
# also Qt Linguist's translation format)
VIDEO_TYPES = {".mp4": "video/mp4", ".m4v": "video/mp4", ".mov": "video/quicktime", ".webm": "video/webm",
               ".mkv": "video/x-matroska", ".avi": "video/x-msvideo", ".mpg": "video/mpeg", ".mpeg": "video/mpeg",
               ".ts": "video/mp2t", ".ogv": "video/ogg", ".3gp": "video/3gpp", ".flv": "video/x-flv",
               ".wmv": "video/x-ms-wmv"}
VIDEO_SUFFIXES = tuple(VIDEO_TYPES)
MAX_LISTED = 2000  # videos listed at most (the reply says when there were more)
MAX_DEPTH = 8  # folders below --allowed-media-dir that are listed
ASSETS = {"page.css": "text/css; charset=utf-8", "page.js": "text/javascript; charset=utf-8"}
# the page loads nothing from elsewhere: scripts and styles from this server only; the contact sheet
# arrives as a data: URL, a picked video as a blob: URL
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
          "media-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def _static(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def add_page(app: FastAPI) -> None:
    """Add the page and its endpoints to `app` (made by `create_app`; settings in app.state)."""

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page(request: Request) -> Response:
        needs_key = "required" if request.app.state.settings.api_key else "none"
        html = _static("index.html").replace("{{API_KEY}}", needs_key)
        return Response(html, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.api_route("/page/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise ApiError(404, f"no such file in the page: {name}", code="unknown_url")
        return Response(_static(name), media_type=ASSETS[name], headers=HEADERS)

    @app.get("/v1/ottvid/info", dependencies=[Depends(require_key)])
    async def info(request: Request) -> dict[str, Any]:
        """What this server offers, for the page's controls."""
        settings = request.app.state.settings
        backbone = getattr(request.app.state.engine, "backbone", None)
        worker = getattr(request.app.state, "worker", None)
        grounds = backbone is None or bool(getattr(backbone, "grounds", False))
        return {"object": "ottvid.server", "model": settings.model_id,
                "tasks": ["ask", "ground"] if grounds else ["ask"], "methods": list(METHODS),
                "presets": list(PRESETS), "ratio": 0.1, "frames": getattr(backbone, "default_frames", None),
                "max_tokens": DEFAULT_TOKENS, "max_upload_bytes": settings.max_upload_bytes,
                "media_folder": settings.allowed_media_dir is not None,
                "ready": getattr(worker, "ready", True), "load_ms": getattr(backbone, "load_ms", None),
                "warmup_ms": getattr(worker, "warmup_ms", None)}

    @app.get("/v1/ottvid/media", dependencies=[Depends(require_key)])
    async def media_list(request: Request) -> dict[str, Any]:
        """The videos under --allowed-media-dir, by path relative to it, with the URL to send."""
        policy: MediaPolicy = request.app.state.media
        if policy.allowed is None:
            raise ApiError(403, "this server serves no local files (start it with --allowed-media-dir DIR)",
                           code="media_not_allowed")
        data, more = await run_in_threadpool(list_media, policy)
        return {"object": "list", "data": data, "truncated": more}

    @app.get("/v1/ottvid/media/{name:anypath}", dependencies=[Depends(require_key)])
    async def media_file(name: str, request: Request) -> FileResponse:
        """One video under --allowed-media-dir, as the folder listing names it."""
        policy: MediaPolicy = request.app.state.media
        if policy.allowed is None:
            raise ApiError(403, "this server serves no local files (start it with --allowed-media-dir DIR)",
                           code="media_not_allowed")
        media = await run_in_threadpool(_video_file, policy, name)
        # served from the file that was checked (held open until the response is sent)
        kind = VIDEO_TYPES[os.path.splitext(media.real)[1].lower()]
        return _VideoFile(media.path, media_type=kind, headers={"Cache-Control": "no-cache",
                                                                "X-Content-Type-Options": "nosniff"},
                          background=BackgroundTask(media.cleanup))

    app.add_api_route("/v1/ottvid/media/{name:anypath}", media_file, methods=["HEAD"], include_in_schema=False,
                      dependencies=[Depends(require_key)])


class _VideoFile(FileResponse):
    """A file answered with Range requests, a malformed Range header ignored (the whole file, 200), as
    RFC 9110 lets a server do, rather than Starlette's plain-text 400."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []


class _AnyPath(Convertor):
    """A path parameter that may hold any character, a newline too (Starlette's `path` stops at one)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anypath", _AnyPath())


def _video_file(policy: MediaPolicy, name: str) -> Media:
    """Video `name` (relative to the folder) opened through the API's own check; the caller cleans up."""
    if "\x00" in name:
        raise ApiError(400, "the video's name holds a NUL byte", code="invalid_video")
    if not name.lower().endswith(VIDEO_SUFFIXES):
        raise ApiError(404, f"not a video file: {name}", code="invalid_video")
    media = policy.resolve(os.path.join(policy.allowed, name))  # 403 outside the folder, 400 missing
    if not media.real.lower().endswith(VIDEO_SUFFIXES):  # a link named .mp4 to some other file
        media.cleanup()
        raise ApiError(404, f"not a video file: {name}", code="invalid_video")
    return media


def list_media(policy: MediaPolicy, limit: int = MAX_LISTED) -> tuple[list[dict[str, Any]], bool]:
    """([{name, url, bytes}], whether there were more than `limit`): the video files under the
    folder (hidden ones and links leading out of it left out), folder by folder in name order."""
    root = policy.allowed
    found: list[dict[str, Any]] = []
    for folder, subfolders, files in os.walk(root, followlinks=False):
        depth = 0 if folder == root else os.path.relpath(folder, root).count(os.sep) + 1
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and _utf8(d)) if depth < MAX_DEPTH else []
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(VIDEO_SUFFIXES) or not _utf8(folder, name):
                continue
            path = os.path.join(folder, name)
            try:
                media = _video_file(policy, os.path.relpath(path, root))
            except (ApiError, OSError):  # a link out of the folder, or gone meanwhile
                continue
            try:
                size = os.fstat(media.fd).st_size if media.fd is not None else os.path.getsize(media.path)
            finally:
                media.cleanup()
            if len(found) == limit:
                return found, True
            found.append({"name": Path(os.path.relpath(path, root)).as_posix(), "url": Path(path).as_uri(),
                          "bytes": size})
    return found, False


def _utf8(*names: str) -> bool:
    """Whether the names are UTF-8 text: one that is not (os.walk gives its bytes as lone surrogates)
    cannot be written in a JSON reply or a URL the page sends back, so it is not listed."""
    try:
        for name in names:
            name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
