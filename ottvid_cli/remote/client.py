"""The client (httpx) behind `ottvid ask --server URL` and `ground --server`: a running `ottvid serve`,
or any OpenAI-compatible server such as vLLM's (`openai_compat.py` builds and reads those requests;
the command line's `cli.steps.remote` checks, prints and exits; nothing here prints).

A local video is first named by its path (a `file://` URL: nothing is copied when the server runs on
this machine and may read it, under its --allowed-media-dir, or vLLM's --allowed-local-media-path);
if the server refuses the path, the file is uploaded as a `data:` URL. OTTVID_API_KEY, when set, is
sent as the Bearer token.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

URL_SCHEMES = ("data:", "file://", "http://", "https://")
STREAMED_FIELDS = ("id", "model", "usage", "metrics", "ottvid")  # what `Client.chat` keeps of a stream's chunks


class ServerError(Exception):
    """The server answered an error (or could not be reached); `exit_code` as the CLI's."""

    def __init__(self, message: str, exit_code: int, code: str | None = None):
        super().__init__(message)
        self.exit_code, self.code = exit_code, code


class Client:
    """A small synchronous client of `ottvid serve` or another OpenAI-compatible server (httpx): the
    model served, and one chat completion."""

    def __init__(self, server: str, api_key: str | None = None, timeout: float | None = None):
        import httpx

        base = server.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self.http.close()

    def model_card(self) -> dict[str, Any]:
        """The first model the server lists (GET /v1/models): `id`, and `owned_by` ("ottvid" for
        `ottvid serve`, "vllm" for vLLM, ...)."""
        response = self._checked(self._send("GET", "/v1/models"))
        try:
            data = response.json()
        except ValueError:  # not JSON: some other web server
            data = None
        cards = data.get("data") if isinstance(data, dict) else None
        if not cards or not isinstance(cards[0], dict) or not isinstance(cards[0].get("id"), str):
            raise ServerError(f"{self.base}/v1/models lists no model: is this an OpenAI-compatible server?", 1)
        return cards[0]

    def run(self, body: dict[str, Any], on_token=None) -> dict[str, Any]:
        """POST /v1/chat/completions to `ottvid serve`: the `ottvid` object of the reply (see `chat`)."""
        run = self.chat(body, on_token).get("ottvid")
        if run is None:
            raise ServerError("the server's reply holds no ottvid result", 1)
        return run

    def chat(self, body: dict[str, Any], on_token=None) -> dict[str, Any]:
        """POST /v1/chat/completions: the completion. With `on_token`, the reply is streamed, each piece
        of text passed to it as it arrives, and the completion put together from the chunks (the text,
        the finish reason, and `id`, `model`, `usage`, `metrics`, `ottvid` where a chunk holds them)."""
        if on_token is None:
            return self._checked(self._send("POST", "/v1/chat/completions", json=body)).json()
        import httpx

        text, whole = [], {}
        finish = None
        try:
            with self.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                if response.status_code >= 400:
                    response.read()
                    self._checked(response)
                for data in _events(response.iter_lines()):
                    if "error" in data:
                        raise _error_of(data, 500)
                    for choice in data.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            text.append(piece)
                            on_token(piece)
                        finish = choice.get("finish_reason") or finish
                    whole.update({k: data[k] for k in STREAMED_FIELDS if data.get(k) is not None})
        except httpx.TransportError as exc:
            raise ServerError(f"lost the connection to {self.base}: {exc}", 1) from None
        return {**whole, "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                                      "finish_reason": finish}]}

    def _send(self, method: str, path: str, **kwargs):
        import httpx

        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach the server at {self.base}: {exc or type(exc).__name__}", 1) from None

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


@dataclass(frozen=True)
class OttvidServer:
    """ask / ground at `ottvid serve`: the question as it is, our settings in the body's `ottvid` field,
    and the `ottvid` object of the reply (what `openai_compat.PlainServer` does for a plain server)."""

    task: str
    settings: dict[str, Any]
    max_new_tokens: int | None = None

    def send(self, client: Client, model: str, url: str, text: str, on_token=None) -> dict[str, Any]:
        return client.run(request_body(model, self.task, url, text, self.settings, self.max_new_tokens), on_token)

    @staticmethod
    def path_refused(error: ServerError) -> bool:
        """Whether the server may not read the file:// path (403, outside its --allowed-media-dir)."""
        return error.code == "media_not_allowed"
