"""The client's HTTP/1.1 connection: aiohttp's `RequestHandler` with five changes.

* The stream being sent on the connection (`listener`, proxy/server/data/stream.py) hears at
  once when the transport asks to pause writing, to resume, and when the connection is lost:
  that is how a slow client holds its upstream back, and how one that leaves closes it, with
  no coroutine waiting on every write.

* A request head must be complete within `request_timeout` of the connection opening, or of its
  first byte on a kept-alive connection; else the connection is closed (slowloris). aiohttp
  has no header timeout: only its keep-alive timer (`client_keepalive_timeout`), which is
  meant to be long. The body's own deadline is proxy/server/control/request_body.py's.
* Errors aiohttp writes on its own (a malformed request line or header, an unhandled
  exception) are the one JSON shape, like every other error of the proxy.
* A client that half-closes as it sends its request (`shutdown(SHUT_WR)`: "no more data from
  me", RFC 9293 §3.6) is answered on the direction still open; aiohttp would close the
  connection at the EOF and cancel the request. But an EOF is also how most clients that give
  up and leave close their connection, and that must still cancel the request so the backend
  stops generating. Nothing on the wire tells the two apart; the timing does: a half-closing
  client's EOF follows its last byte at once, a leaving client's comes later. An EOF within
  `HALF_CLOSE_GRACE` of the request becoming whole is a half-close; a later one, a departure.
* A body that breaks its framing mid-way fails its reader at once (400) instead of leaving it
  waiting. That request, and one whose body stopped arriving (408), close the connection as
  soon as their answer is written, instead of lingering for the rest of a body that is not
  coming.

aiohttp's `Server` always makes a plain `RequestHandler`, so `ProxyRunner` (the `AppRunner`
`proxy.server.process.runner` serves with) hands the listening socket a `ProxyServer` that
makes ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest

# The response to a request aiohttp could not parse or hand over (status, message or None):
# rendered by the control plane, so every error has its one shape.
ErrorRenderer = Callable[[int, "str | None"], web.StreamResponse]

# How soon after the last byte of a request its sender's EOF must come to be taken for a
# half-close. A client that really left this quickly is noticed at the first write instead.
HALF_CLOSE_GRACE = 0.25


class ClientListener(Protocol):
    """What the stream on a connection is told about its client, as it happens."""

    def client_paused(self) -> None: ...

    def client_resumed(self) -> None: ...

    def client_lost(self) -> None: ...


class ProxyProtocol(RequestHandler):
    __slots__ = (
        "_answered",
        "_carry",
        "_close_after_response",
        "_head_timeout",
        "_head_timer",
        "_last_chunked",
        "_last_payload",
        "_on_head_timeout",
        "_render_error",
        "_sent_all",
        "_whole_at",
        "listener",
    )

    def __init__(
        self,
        *args: Any,
        head_timeout: float = 0.0,
        on_head_timeout: Callable[[], None] = lambda: None,
        render_error: ErrorRenderer,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._render_error = render_error
        self._head_timeout = head_timeout  # 0: none
        self._on_head_timeout = on_head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._answered = 0  # responses finished on this connection
        self._last_payload: StreamReader | None = None  # body of the last request parsed
        self._last_chunked = False  # ... and whether it is chunked
        self._carry = b""  # the last bytes of an unfinished head
        self._sent_all = False  # the client half-closed after whole requests
        self._whole_at = 0.0  # loop time the last request's last byte arrived
        self._close_after_response = False
        self.listener: ClientListener | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._await_head()  # a new connection owes its first request head

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.client_lost()  # before aiohttp cancels the handler, a loop turn later
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.listener is not None:
            self.listener.client_paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.listener is not None:
            self.listener.client_resumed()

    def _await_head(self) -> None:
        if self._head_timeout > 0 and self._head_timer is None:
            self._head_timer = self._loop.call_later(self._head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._request_count > self._answered:
            # A pipelined head waits while the request before it is answered: its turn comes.
            self._await_head()
            return
        self._on_head_timeout()
        self.force_close()  # no 408: nothing says the client would read it (RFC 9110 §15.5.9)

    def close_after_response(self) -> None:
        """Close the connection once the current response is written, without reading the
        rest of the request's body first (aiohttp's lingering close waits up to 10 s for it)."""
        self._close_after_response = True

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count  # aiohttp counts every request head it parses
        last = self._last_payload
        fed = last.total_bytes if last is not None else 0
        in_head = last is None or last.is_eof()  # no body is arriving: a head is
        carry, self._carry = self._carry, b""
        super().data_received(data)
        new = self._request_count - parsed
        if new and self._messages:
            self._stop_head_timer()
            self._parsed(*self._messages[-1], new=new, chunk=carry + data)
            if self._last_payload is not None and self._last_payload.is_eof():
                self._whole_at = self._loop.time()
        elif in_head and data:
            self._await_head()
            self._carry = (carry + data)[-3:]  # a head's empty line may straddle chunks
        elif last is not None and last.is_eof() and data:
            self._whole_at = self._loop.time()
            # This chunk ended a body: whatever follows the body in it begins a head.
            body = last.total_bytes - fed
            if not _ends_request(data, head_in_chunk=False, chunked=self._last_chunked, body=body):
                self._await_head()

    def _parsed(
        self,
        message: RawRequestMessage | _ErrInfo,
        payload: StreamReader,
        *,
        new: int,
        chunk: bytes,
    ) -> None:
        """`chunk` completed `new` request heads, the last one `message`."""
        last = self._last_payload
        self._last_payload = payload
        if isinstance(message, _ErrInfo):
            if last is not None and not last.is_eof():
                # A framing error mid-body (a bad chunk size): llhttp drops the body it was
                # filling without a word, which would leave its reader waiting for the rest.
                last.set_exception(web.RequestPayloadError(message.message))
            return
        self._last_chunked = message.chunked
        if not payload.is_eof():
            return  # the body goes on in later chunks
        body = payload.total_bytes
        # Several requests in one chunk (pipelined): where each ends is anyone's guess.
        if new > 1 or not _ends_request(
            chunk, head_in_chunk=True, chunked=message.chunked, body=body
        ):
            self._await_head()  # bytes after a whole request: the next head's clock starts

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's signature
        """The client closed its sending side. If it did so as it finished a request still to
        be answered, keep the connection half-open (returning True keeps asyncio from closing
        the transport), answer, then close. Otherwise (nothing pending, a request head or body
        cut short, or a client that left while waiting) close now, as aiohttp does: that
        cancels the request."""
        last = self._last_payload
        pending = self._request_count > self._answered
        whole = last is None or last.is_eof()
        if pending and whole and self._loop.time() - self._whole_at <= HALF_CLOSE_GRACE:
            self._sent_all = True  # closed once every request is answered (finish_response)
            return True
        return False

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if self._close_after_response:
            resp.force_close()  # says `Connection: close` (RFC 9112 §9.6)
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answered += 1
            if self._close_after_response:
                self.force_close()  # the transport still writes out what is buffered
            elif self._sent_all and self._answered >= self._request_count:
                self.close()  # no keep-alive: nothing more can come

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own: it logs, and refuses (ConnectionError) once a response has started.
        super().handle_error(request, status, exc, message)
        response = self._render_error(status, message)
        response.force_close()  # the parser cannot find where the next request would start
        return response


def _ends_request(data: bytes, *, head_in_chunk: bool, chunked: bool, body: int) -> bool:
    """Whether `data`, the chunk that completed a request's body (and its head, if
    `head_in_chunk`; `body` of the body's bytes were in it), ends where the request ends, or
    holds the start of a pipelined head after it. llhttp does not say where a request ended, so
    this reckons it, and says no when unsure: a wrong no only closes an idle connection after
    `request_timeout` instead of `client_keepalive_timeout`."""
    if chunked:
        # A chunked body ends with an empty line (RFC 9112 §7.1); an unfinished head cannot.
        return data.endswith(b"\r\n\r\n")
    if not head_in_chunk:
        return body == len(data)  # the whole chunk was body
    end = data.find(b"\r\n\r\n")  # a head ends with an empty line (RFC 9112 §2.1)
    return end >= 0 and end + 4 + body == len(data)


class ProxyServer(web.Server):
    """aiohttp's `Server`, making `ProxyProtocol` connections."""

    def __init__(
        self,
        *args: Any,
        head_timeout: float,
        on_head_timeout: Callable[[], None],
        render_error: ErrorRenderer,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self.on_head_timeout = on_head_timeout
        self.render_error = render_error

    def __call__(self) -> RequestHandler:
        return ProxyProtocol(
            self,
            loop=self._loop,
            head_timeout=self.head_timeout,
            on_head_timeout=self.on_head_timeout,
            render_error=self.render_error,
            **self._kwargs,
        )
