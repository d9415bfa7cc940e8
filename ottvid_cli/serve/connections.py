"""Connections that cannot sit idle: uvicorn's HTTP/1.1 protocol (h11) with a deadline on the request head.

uvicorn closes a kept-alive connection that stays silent after a response (`timeout_keep_alive`),
but a connection that never sends a complete request head (nothing at all after connecting, or one
byte at a time) is kept forever, and so is one that stops in the middle of its body: a few thousand
of them hold the server's sockets and memory. Here each connection must deliver a whole request
head within `HEAD_TIMEOUT` seconds of connecting or of its last response, and, while it sends a
body, a piece of it at least every `HEAD_TIMEOUT` seconds; otherwise it is closed. Once the request
has arrived, the model's work and a streamed reply are not affected: their limit is `--timeout`.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT = 10.0  # seconds for a request head to arrive


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head, or the next piece of its
    body, is late (module docstring)."""

    head_timeout = HEAD_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:  # a request head arrived
            if self.conn.their_state is h11.SEND_BODY:
                self._arm()  # its body: the next piece within the deadline
            else:
                self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self.timeout_keep_alive_handler()  # h11's own closing of an idle connection
        elif self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self.transport.close()  # a body that stopped coming: the request sees a disconnect


def with_head_timeout(seconds: float) -> type[HeadTimeoutProtocol]:
    """The protocol class with another deadline (tests use a short one)."""
    return type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), {"head_timeout": seconds})
