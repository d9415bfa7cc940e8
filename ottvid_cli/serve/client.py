"""The client of a running `ottvid serve` (httpx) behind `ottvid ask --server URL` and `ground
--server` (the command line's `_remote` checks, prints and exits; nothing here prints).

A local video is first named by its path (a `file://` URL: nothing is copied when the server runs on
this machine and may read it, under its --allowed-media-dir); if the server refuses the path (403),
the file is uploaded as a `data:` URL. OTTVID_API_KEY, when set, is sent as the Bearer token.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from pathlib import Path
from typing import Any, Iterator

URL_SCHEMES = ("data:", "file://", "http://", "https://")


class ServerError(Exception):
    """The server answered an error (or could not be reached); `exit_code` as the CLI's."""

    def __init__(self, message: str, exit_code: int, code: str | None = None):
        super().__init__(message)
        self.exit_code, self.code = exit_code, code


class Client:
    """A small synchronous client of `ottvid serve` (httpx): the model served, and one run."""

    def __init__(self, server: str, api_key: str | None = None, timeout: float | None = None):
        import httpx

        base = server.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self.http.close()

    def model(self) -> str:
        """The id of the model the server serves (GET /v1/models)."""
        data = self._checked(self._send("GET", "/v1/models")).json()
        return data["data"][0]["id"]

    def run(self, body: dict[str, Any], on_token=None) -> dict[str, Any]:
        """POST /v1/chat/completions: the `ottvid` object of the reply. With `on_token`, the reply is
        streamed and each piece of text passed to it as it arrives."""
        if on_token is None:
            return self._checked(self._send("POST", "/v1/chat/completions", json=body)).json()["ottvid"]
        import httpx

        try:
            with self.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                if response.status_code >= 400:
                    response.read()
                    self._checked(response)
                run = None
                for data in _events(response.iter_lines()):
                    if "error" in data:
                        raise _error_of(data, 500)
                    for choice in data.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            on_token(piece)
                    run = data.get("ottvid", run)
        except httpx.TransportError as exc:
            raise ServerError(f"lost the connection to {self.base}: {exc}", 1) from None
        if run is None:
            raise ServerError("the server's stream ended without a result", 1)
        return run

    def _send(self, method: str, path: str, **kwargs):
        import httpx

        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach ottvid serve at {self.base}: {exc or type(exc).__name__}", 1) from None

    @staticmethod
    def _checked(response):
        if response.status_code < 400:
            return response
        try:
            data = response.json()
        except ValueError:
            data = {"error": {"message": response.text[:200] or response.reason_phrase}}
        raise _error_of(data, response.status_code)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent-event stream, up to `data: [DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


def _error_of(data: dict[str, Any], status: int) -> ServerError:
    error = data.get("error") if isinstance(data, dict) else None
    error = error if isinstance(error, dict) else {"message": str(data)[:200]}
    message = f"server: {error.get('message') or 'error'} (HTTP {status})"
    return ServerError(message, 2 if 400 <= status < 500 else 1, error.get("code"))


def video_url(video: str, upload: bool = False) -> str:
    """A URL for the request: URLs as given; a local file as file:// (or, with `upload`, as data:)."""
    if video.startswith(URL_SCHEMES):
        return video
    path = Path(video).expanduser().resolve()
    if not upload:
        return path.as_uri()
    mime = mimetypes.guess_type(path.name)[0] or "video/mp4"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def request_body(model: str, task: str, url: str, text: str, options: dict[str, Any],
                 max_new_tokens: int | None) -> dict[str, Any]:
    """The chat-completions body `ottvid serve` takes (the same a user writes for the openai client)."""
    body = {"model": model,
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                      {"type": "text", "text": text}]}],
            "ottvid": {"task": task, **{k: v for k, v in options.items() if v is not None}}}
    if max_new_tokens is not None:
        body["max_tokens"] = max_new_tokens
    return body
