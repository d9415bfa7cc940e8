"""Who may call the server and which videos it may read.

- API key: with one set (`--api-key` or OTTVID_API_KEY), every /v1 request needs
  `Authorization: Bearer KEY`; the comparison is constant-time (`secrets.compare_digest`).
- Local files (`file://` URLs or absolute paths) are read only from under `--allowed-media-dir`.
  The name is resolved (symlinks, `..`) and checked, then the file is opened once, at once (no
  following of a final symlink, non-blocking so a fifo cannot hang the server), and what was opened
  is checked: a regular file whose real path is inside the folder. The decoder reads that open file
  (`/proc/self/fd/N` on Linux), so a name swapped after the check changes nothing. Without the flag
  no local file is served.
- `data:` URLs (base64) up to `--max-upload-mb` are written to a private temporary file (mode 0600
  in a 0700 folder) and deleted when the request ends.
- `http(s)` and every other scheme are refused: the server downloads nothing.
- The Host header must name a host the server answers to (`HostCheck`): DNS rebinding.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers


class ApiError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 503: "overloaded_error",
             504: "timeout_error"}  # any other 4xx: invalid_request_error; 5xx: server_error

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, type: str | None = None):
        message, param = _text(message), None if param is None else _text(param)
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}
        self.type = type or self.TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _text(value: str) -> str:
    """`value` as UTF-8 can carry it: a lone surrogate (from a request's \\ud800, or a file name that is
    not UTF-8) is written as its escape, so that an error about it can still be sent."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


# ------------------------------------------------------------------------------------------------
# the API key

_bearer = HTTPBearer(auto_error=False, description="The server's --api-key, when it has one.")


def require_key(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """A FastAPI dependency: the Bearer token must equal the server's key (when it has one)."""
    key: str | None = request.app.state.settings.api_key
    if not key:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode("utf-8"), key.encode("utf-8")):
        raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer KEY`" if given == ""
                       else "wrong API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


# ------------------------------------------------------------------------------------------------
# the Host header (DNS rebinding)


class HostCheck:
    """ASGI middleware: 421 for a request whose Host header names no host this server answers to.

    A web page on another origin whose name its owner points at 127.0.0.1 (DNS rebinding) reaches a
    loopback server from the user's browser, as its own origin: the Host it sends is that name.
    Answered: IP addresses (a browser sends one only when the user typed it), `localhost` and
    `*.localhost` (which browsers resolve to loopback themselves), and `names` (the listening
    address, --allowed-host: a reverse proxy's name; "*" lets every name through). A request
    without Host (HTTP/1.0, not a browser) is answered."""

    def __init__(self, app, names: tuple[str, ...] = ()):
        self.app = app
        self.names = {_hostname(name) for name in names if name}

    def allows(self, host: str) -> bool:
        name = _hostname(host)
        if "*" in self.names or name in self.names or name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host")
            if host is not None and not self.allows(host):
                error = ApiError(421, f"this server does not answer to the host {host[:100]!r} (a page on another "
                                      f"site pointing its name here?): use localhost or an IP address, or start the "
                                      f"server with --allowed-host NAME", code="host_not_allowed", param="Host")
                return await JSONResponse(error.body(), status_code=421)(scope, receive, send)
        await self.app(scope, receive, send)


def _hostname(host: str) -> str:
    """The name of a Host header value or --allowed-host, without its port or final dot, lowercased
    ("[::1]:8000" -> "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


# ------------------------------------------------------------------------------------------------
# media


UPLOAD = "the uploaded video"  # what replies name an upload (never its temporary file)


@dataclass
class Media:
    """A video the worker may decode: `path` (what the decoder opens: `/proc/self/fd/N` for a local
    file held open in `fd`, or an upload's temporary file), `name` (what the request named: the only
    name replies and errors show), whether it is an upload to delete afterwards, and `real`: the
    checked real path of the local file that was opened (empty for an upload)."""

    path: str
    name: str = UPLOAD
    temporary: bool = False
    fd: int | None = None
    real: str = ""

    def cleanup(self) -> None:
        """Close the held file and delete an upload (idempotent)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
        if self.temporary:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.temporary = False


_SUFFIXES = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/x-matroska": ".mkv",
             "video/x-msvideo": ".avi", "video/mpeg": ".mpg"}


class MediaPolicy:
    """Turns a `video_url` into a readable local file, or refuses it (ApiError 400/403/413)."""

    def __init__(self, allowed_dir: str | Path | None, max_upload_bytes: int, upload_dir: str | Path):
        self.allowed = os.path.realpath(allowed_dir) if allowed_dir is not None else None
        self.max_upload_bytes = max_upload_bytes
        self.upload_dir = str(upload_dir)

    def resolve(self, url: str, param: str = "messages") -> Media:
        if url.startswith("data:"):
            return self._upload(url, param)
        parsed = urlparse(url)
        if parsed.scheme in ("http", "https"):
            raise ApiError(400, "the server downloads nothing: send the video as a data: URL (base64), or a "
                                "file:// URL under the server's --allowed-media-dir", code="url_not_allowed",
                           param=param)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ApiError(400, f"file URL with a host ({parsed.netloc!r}): only local files are served",
                               code="url_not_allowed", param=param)
            path = unquote(parsed.path)
        elif parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):  # C:\ on Windows
            path = url
        else:
            raise ApiError(400, f"unsupported video URL scheme {parsed.scheme!r}: use data: or file://",
                           code="url_not_allowed", param=param)
        if "\0" in path:
            raise ApiError(400, "the video path contains a NUL character", code="invalid_video", param=param)
        return self._local(path, param)

    def _inside(self, real: str) -> bool:
        try:
            return os.path.commonpath([real, self.allowed]) == self.allowed
        except ValueError:  # another drive (Windows)
            return False

    def _local(self, path: str, param: str) -> Media:
        """Open the named file once and check what was opened (docs/serve.md, Security)."""
        if not os.path.isabs(path):
            raise ApiError(400, "a local video must be an absolute path or a file:// URL", code="invalid_video",
                           param=param)
        if self.allowed is None:
            raise ApiError(403, "this server serves no local files (start it with --allowed-media-dir DIR)",
                           code="media_not_allowed", param=param)
        outside = ApiError(403, "the video is outside the server's --allowed-media-dir", code="media_not_allowed",
                           param=param)
        real = os.path.realpath(path)  # symlinks and `..` resolved before the check
        if not self._inside(real):
            raise outside
        try:  # the resolved name; a final symlink here was swapped in after realpath: refused (ELOOP)
            fd = os.open(real, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            raise ApiError(400, f"video not found: {path}", code="invalid_video", param=param) from None
        except OSError as exc:
            raise ApiError(400, f"cannot open the video {path}: {exc.strerror or 'refused'}", code="invalid_video",
                           param=param) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a fifo, socket or device)"
                raise ApiError(400, f"the video {path} is {what}", code="invalid_video", param=param)
            opened = _opened_path(fd, real, info)
            if not self._inside(opened):
                raise outside
        except BaseException:
            os.close(fd)
            raise
        return Media(_fd_path(fd) or real, name=path, fd=fd, real=opened)

    def _upload(self, url: str, param: str) -> Media:
        header, sep, payload = url[5:].partition(",")
        if not sep or not header.endswith(";base64"):
            raise ApiError(400, "a data: URL must be base64 (data:video/mp4;base64,...)", code="invalid_video",
                           param=param)
        limit_mb = self.max_upload_bytes / (1 << 20)
        if len(payload) // 4 * 3 > self.max_upload_bytes + 2:
            raise ApiError(413, f"the uploaded video is larger than the server's limit ({limit_mb:g} MB)",
                           code="upload_too_large", param=param)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "the data: URL is not valid base64", code="invalid_video", param=param) from None
        if len(data) > self.max_upload_bytes:
            raise ApiError(413, f"the uploaded video is larger than the server's limit ({limit_mb:g} MB)",
                           code="upload_too_large", param=param)
        mime = header[: -len(";base64")].split(";")[0].strip().lower()
        fd, path = tempfile.mkstemp(prefix="upload-", suffix=_SUFFIXES.get(mime, ".bin"), dir=self.upload_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return Media(path, name=UPLOAD, temporary=True)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # Windows has no fifos to block on
_PROC_FD = "/proc/self/fd"


def _fd_path(fd: int) -> str | None:
    """A name that opens the very file `fd` holds (Linux: /proc/self/fd/N reopens its inode, whatever
    its name has become); None where the platform has none (the checked real path is decoded then)."""
    return f"{_PROC_FD}/{fd}" if os.path.isdir(_PROC_FD) else None


def _opened_path(fd: int, real: str, info: os.stat_result) -> str:
    """The real path of the file `fd` holds: its /proc link on Linux; elsewhere `real`, if that name
    still leads to the same file (device and inode), else "" (it changed: refused)."""
    fd_path = _fd_path(fd)
    if fd_path is not None:
        return os.readlink(fd_path).removesuffix(" (deleted)")
    try:
        now = os.stat(real)
    except OSError:
        return ""
    return real if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino) else ""
