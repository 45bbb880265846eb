"""One HTTP/1.1 connection to an upstream, as an `asyncio.Protocol`: the body by callbacks.

The data plane owns its upstream connections instead of reading through aiohttp's client, so
that what each socket read brings goes from `data_received` through the C parser (`httptools`,
llhttp) to the stream's sink in one call, with no coroutine resumed: llhttp's `on_body`
callbacks only collect the read's body bytes, however many HTTP chunks it held, and once the
parser is through the read the sink gets them in one piece (docs/BENCHMARKS.md "The callback
data plane" has it measured). A connection carries one request at a time; the pool
(`connections.py`) keeps it alive between them.

* The head is awaited (`request()`), once per request: a coroutine there costs nothing per
  token. Interim 1xx answers are skipped (RFC 9110 §15.2); the head may not exceed
  `MAX_HEAD_BYTES`; a head the proxy cannot relay (core/http/response_head.py: a status
  outside 100-599 or a 101, a `Transfer-Encoding` other than one `chunked`) is a `BadResponse`,
  and a reason phrase it cannot repeat is dropped for the proxy's own.
* A failure says how far the request got (`nothing_sent`, `nothing_received`, `stale`): what
  decides whether it may be sent again (`upstreams.py`).
* The body goes to a `BodySink` (`attach`): `on_data` once per read, with the body bytes the
  read brought, `on_end` once, or `on_error` once. What arrives before a sink is attached is
  kept for it.
* A chunked body whose sink wants it (`want_native`) is taken over at a chunk boundary by the
  native step (proxy/core/steady): each read is then one C call, whose bytes go straight to
  the client's transport once the sink armed it for its body (`steady`, `steady_to`); a read it
  declines goes to the sink as llhttp would have delivered it, and framing it does not plainly
  handle (an extension, trailers, the last chunk) goes back to llhttp, which is at a chunk
  boundary as after the head.
* Reading pauses and resumes on the sink's word (the client's backpressure).
* Reuse only when the request was written whole, the response was read to its end and both
  sides keep the connection alive (RFC 9112 §9.3); anything else closes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.errors import (
    ProxyError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.core.http.response_head import relayed_reason, status_refusal, transfer_coding_refusal
from proxy.core.steady import NATIVE

if TYPE_CHECKING:
    from proxy.core.steady._steady import Step

# A head larger than this is an upstream gone wrong, not a response (aiohttp's client allows
# 8 KiB per field and 32 KiB in all; backends send well under 1 KiB).
MAX_HEAD_BYTES: Final = 64 * 1024
# A request body goes out in writes of this size, the loop turning in between, so a 32 MiB
# token-ID prompt never sits whole in the transport's buffer.
_BODY_WRITE_BYTES: Final = 256 * 1024
# Statuses that never have a body, whatever their headers say (RFC 9112 §6.3).
_NO_BODY: Final = frozenset({204, 304})


class UpstreamConnectionError(Exception):
    """The connection failed. `nothing_sent`: no byte of the request was written, so it never
    reached the upstream; `nothing_received`: no byte of a response came back."""

    nothing_sent = False
    nothing_received = False


class ConnectFailed(UpstreamConnectionError):
    """Refused, unreachable, a name that does not resolve, a TLS handshake that failed."""

    nothing_sent = True
    nothing_received = True


class ConnectTimedOut(ConnectFailed):
    pass


class Disconnected(UpstreamConnectionError):
    """The upstream closed the connection before the response was whole."""

    def __init__(self, message: str, *, before_response: bool, sent: bool, reused: bool) -> None:
        super().__init__(message)
        self.nothing_sent = not sent
        self.nothing_received = before_response
        # Closed unanswered on a kept-alive connection: most likely one the upstream had
        # already closed while it sat in the pool (the stale-connection race), which it read
        # nothing of. On a fresh connection, the upstream closed after reading the request.
        self.stale = before_response and reused


class BadResponse(UpstreamConnectionError):
    """What the upstream sent is not HTTP/1.1 this proxy can relay."""


# What a failed upstream exchange is to the client: the first row whose class the failure is
# (the most specific first), as httpx maps httpcore's exceptions: the error, its code, and the
# words a log line says it in. Anything else is a plain 502.
_PROXY_ERRORS: Final[tuple[tuple[type[BaseException], type[ProxyError], str | None, str], ...]] = (
    (ConnectTimedOut, UpstreamTimeout, "connect_timeout", "upstream connect timed out"),
    (ConnectFailed, UpstreamUnavailable, "unreachable", "upstream unreachable"),
    (Disconnected, UpstreamUnavailable, "upstream_closed", "upstream closed the connection"),
    (BadResponse, UpstreamProtocolError, None, "upstream response unusable"),
    # The time-to-first-byte budget ran out waiting for the head.
    (TimeoutError, UpstreamTimeout, "ttft_timeout", "upstream did not answer in time"),
)
_ANY_OTHER: Final = (UpstreamUnavailable, None, "upstream failed")


def proxy_error(exc: BaseException, where: str) -> ProxyError:
    """An upstream exchange's failure as the error the proxy answers with, caused by `exc`:
    its class and code from the table above; its message (for the log: a client reads the
    class's public message) the row's words, `where` (which upstream, at what point) and what
    `exc` says. The proxy's own errors (the watchdog's timeouts, a body's verdict) are already
    that."""
    if isinstance(exc, ProxyError):
        return exc
    error, code, words = next(
        (
            (error, code, words)
            for kind, error, code, words in _PROXY_ERRORS
            if isinstance(exc, kind)
        ),
        _ANY_OTHER,
    )
    detail = str(exc)
    failure = error(f"{words} ({where})" + (f": {detail}" if detail else ""), code=code)
    failure.__cause__ = exc
    return failure


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    # The upstream's reason phrase, or None when it is not repeated and the status goes with
    # the proxy's own phrase (core/http/response_head.py).
    reason: str | None
    # As sent, in order, duplicates kept: relayed byte for byte.
    raw_headers: tuple[tuple[bytes, bytes], ...]
    content_length: int | None
    chunked: bool
    keep_alive: bool

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """For reading fields (`Content-Type`, `Content-Encoding`), values decoded as Latin-1:
        made when asked (once or twice per response), not kept for the stream's life."""
        return CIMultiDictProxy(_decoded(self.raw_headers))


def _decoded(raw: tuple[tuple[bytes, bytes], ...]) -> CIMultiDict[str]:
    headers = CIMultiDict[str]()
    for name, value in raw:
        headers.add(name.decode("latin-1"), value.decode("latin-1"))
    return headers


class BodySink(Protocol):
    def on_data(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: Exception) -> None: ...


class _State(Enum):
    IDLE = "idle"  # connected, no request in flight
    HEAD = "head"  # request sent (or being sent), waiting for the response head
    BODY = "body"  # head in, body arriving
    DONE = "done"  # response read to its end
    CLOSED = "closed"


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "_at_boundary",
        "_body_until_close",
        "_closed_waiter",
        "_drain",
        "_ended",
        "_error",
        "_head_bytes",
        "_head_request",
        "_head_waiter",
        "_headers",
        "_keep_alive",
        "_loop",
        "_native_wanted",
        "_on_closed",
        "_on_data",
        "_parser",
        "_pending",
        "_plain_chunked",
        "_read",
        "_reason",
        "_received",
        "_request_sent",
        "_request_written",
        "_sink",
        "_state",
        "_steady",
        "_steady_write",
        "_transport",
        "_write_paused",
        "reading_paused",
        "requests",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, on_closed: Callable[[], None]) -> None:
        self._loop = loop
        self._on_closed = on_closed  # the pool forgets the connection
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._state = _State.IDLE
        self._head_waiter: asyncio.Future[ResponseHead] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._head_bytes = 0
        self._head_request = False
        self._keep_alive = False
        self._body_until_close = False
        self._request_sent = False  # some of the request was handed to the transport
        self._request_written = False
        self._sink: BodySink | None = None
        self._on_data: Callable[[bytes], None] | None = None  # the sink's, looked up once
        self._pending: list[bytes] = []
        self._read: list[bytes] = []  # body bytes of the read being parsed
        self._ended = False
        self._error: Exception | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._closed_waiter: asyncio.Future[None] | None = None  # made when someone waits
        self.reading_paused = False
        self._received = 0  # body bytes llhttp delivered (`received` adds the native step's)
        self.requests = 0  # requests sent on this connection: more than one means reused
        # The native step (proxy/core/steady): wanted by the sink, possible for this body (one
        # plain chunked framing), llhttp between two chunks, the step, where it writes.
        self._native_wanted = False
        self._plain_chunked = False
        self._at_boundary = False
        self._steady: Step | None = None
        # Where the step's output goes: bytes for the client, or a read's IDs for a body that
        # frames them itself, as the sink armed it.
        self._steady_write: Callable[[Any], object] | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not `asyncio.Transport` subclasses, only alike).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        steady = self._steady
        if steady is not None:
            # The steady path, once per read: one C call, and its bytes to the client.
            try:
                out = steady.feed(data)
            except Exception as exc:  # MemoryError is the step's only error
                self._fail(BadResponse(f"response handling failed: {exc!r}"))
                return
            if out is None:
                self._steady_declined(steady)
            elif out:
                write = self._steady_write
                if write is not None:
                    write(out)
            return
        state = self._state
        if state is not _State.BODY:  # the steady state goes straight to the parser
            if state is not _State.HEAD:
                if state is not _State.CLOSED:
                    # Bytes with no request to answer: the connection cannot be trusted again.
                    self._fail(BadResponse("upstream sent bytes no request asked for"))
                return
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._deliver_read()
            self._parser_failed(exc)
            return
        self._deliver_read()
        # llhttp is between two chunks only if nothing of a size line followed the boundary
        # it last reported: any size line that ends in CRLF is reported as a chunk's header.
        self._at_boundary = self._at_boundary and data[-2:] == b"\r\n"
        if self._native_wanted and self._at_boundary:
            self._take_over()
        if self._state is _State.HEAD and self._head_bytes > MAX_HEAD_BYTES:
            # Reads that still have not completed the head (one read is at most 256 KiB).
            self._fail(BadResponse(f"response head over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        return False  # close: a half-closed upstream sends nothing more

    def connection_lost(self, exc: Exception | None) -> None:
        state = self._state
        self._state = _State.CLOSED
        if self._closed_waiter is not None and not self._closed_waiter.done():
            self._closed_waiter.set_result(None)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._on_closed()
        if state is _State.HEAD:
            error = Disconnected(
                "upstream closed the connection before answering",
                before_response=True,
                sent=self._request_sent,
                reused=self.requests > 1,
            )
            self._deliver_error(error)
        elif state is _State.BODY:
            if self._body_until_close and exc is None:
                self._deliver_end()  # the body ends where the connection does (RFC 9112 §6.3)
            else:
                reason = f": {exc}" if exc is not None else ""
                self._deliver_error(
                    Disconnected(
                        f"upstream closed the connection mid-body{reason}",
                        before_response=False,
                        sent=True,
                        reused=False,
                    )
                )

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # --- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._state is not _State.HEAD:
            # A second answer to one request (bytes after the response's end).
            raise BadResponse("upstream sent bytes no request asked for")
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        refusal = status_refusal(status)
        if refusal is not None:
            raise BadResponse(f"malformed response head: {refusal}")
        if status < 200:
            return  # an interim answer; the final head follows (RFC 9110 §15.2)
        raw = tuple(self._headers)
        headers = _decoded(raw)
        no_body = self._head_request or status in _NO_BODY
        coding = headers.getall("Transfer-Encoding", [])
        refusal = None if no_body else transfer_coding_refusal(coding)
        if refusal is not None:
            raise BadResponse(f"malformed response head: {refusal}")
        length_field = headers.get("Content-Length")
        try:
            length = int(length_field) if length_field is not None else None
        except ValueError:
            length = None  # llhttp has already refused what it could not parse as a length
        chunked = bool(coding) and not no_body
        self._keep_alive = parser.should_keep_alive()
        self._body_until_close = not (no_body or chunked or length is not None)
        head = ResponseHead(
            status=status,
            reason=relayed_reason(self._reason),
            raw_headers=raw,
            content_length=length,
            chunked=chunked,
            keep_alive=self._keep_alive and not self._body_until_close,
        )
        self._state = _State.BODY
        # The native step frames only what llhttp would frame as chunked, and nothing else.
        self._plain_chunked = self._at_boundary = (
            NATIVE is not None and chunked and not no_body and _plainly_chunked(raw)
        )
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(head)
        if self._head_request:
            # llhttp would wait for the body a HEAD answer's Content-Length describes but
            # never sends; the answer ends here, and so does the connection's use.
            self._keep_alive = False
            self._state = _State.DONE
            self._deliver_end()

    def on_body(self, body: bytes) -> None:
        # Kept until the parser has gone through the whole read: what one read brought goes
        # to the sink in one piece, however many HTTP chunks it held. At a backend's pace that
        # is one event; when the proxy falls behind, several, fed, framed and written as one.
        if self._state is not _State.BODY:
            return  # what a HEAD answer's server sent after all: not part of the answer
        self._received += len(body)
        self._read.append(body)

    if NATIVE is not None:
        # httptools looks these up once, with the parser: without the native step they cost
        # nothing per chunk.

        def on_chunk_header(self) -> None:
            self._at_boundary = False

        def on_chunk_complete(self) -> None:
            self._at_boundary = self._plain_chunked

    def on_message_complete(self) -> None:
        if self._state is not _State.BODY:
            return  # an interim 1xx, or a HEAD answer already ended
        self._state = _State.DONE
        self._deliver_read()
        self._deliver_end()

    # --- used by the pool and the exchange -------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def idle(self) -> bool:
        return self._state is _State.IDLE

    @property
    def complete(self) -> bool:
        """The response was read to its end."""
        return self._state is _State.DONE

    @property
    def received(self) -> int:
        """Body bytes of the current response: the idle watchdog reads it."""
        steady = self._steady
        return self._received + (steady.received if steady is not None else 0)

    @property
    def steady(self) -> Step | None:
        """The native step that frames this body, once it took over."""
        return self._steady

    def want_native(self) -> None:
        """The sink has a native binding for its body: take the body over at the first chunk
        boundary (now, if llhttp is at one)."""
        self._native_wanted = True
        if self._at_boundary:
            self._take_over()

    def steady_to(self, write: Callable[[Any], object]) -> None:
        """Where the step's bytes go, for the sink attached (armed by it)."""
        self._steady_write = write

    @property
    def reusable(self) -> bool:
        return self._state is _State.DONE and self._keep_alive and self._request_written

    async def request(self, head: bytes, body: bytes | None, *, head_only: bool) -> ResponseHead:
        """Send one request and wait for its response head (`head_only`: a HEAD request,
        whose answer has no body). Raises `UpstreamConnectionError`."""
        if self._state is not _State.IDLE or self._transport is None:
            raise RuntimeError("the connection is not idle")
        self.requests += 1
        self._state = _State.HEAD
        self._head_request = head_only
        self._head_bytes = 0
        self._request_written = False
        self._set_sink(None)
        self._pending = []
        self._read.clear()
        self._ended = False
        self._error = None
        self._received = 0
        self._steady = None
        self._native_wanted = self._plain_chunked = self._at_boundary = False
        waiter = self._head_waiter = self._loop.create_future()
        transport = self._transport
        # A closing transport drops what it is given: then nothing of the request went out.
        self._request_sent = not transport.is_closing()
        if not body or len(body) <= _BODY_WRITE_BYTES:
            transport.write(head + body if body else head)  # one system call for both
        else:
            transport.write(head)
            view = memoryview(body)
            for start in range(0, len(view), _BODY_WRITE_BYTES):
                if self._state is _State.CLOSED:
                    break  # the head waiter has the reason
                transport.write(view[start : start + _BODY_WRITE_BYTES])
                if self._write_paused:
                    self._drain = self._loop.create_future()
                    await self._drain
        self._request_written = self._state is not _State.CLOSED
        try:
            answer: ResponseHead = await waiter
            return answer
        finally:
            self._head_waiter = None

    def attach(self, sink: BodySink) -> None:
        """From now on the body goes to `sink`; what came before is delivered at once."""
        self._set_sink(sink)
        pending, self._pending = self._pending, []
        for chunk in pending:
            if self._sink is not sink:
                return  # the sink let go while being fed
            sink.on_data(chunk)
        if self._error is not None:
            error, self._error = self._error, None
            sink.on_error(error)
        elif self._ended:
            self._ended = False
            sink.on_end()

    def detach(self) -> None:
        self._set_sink(None)

    def pause_reading(self) -> None:
        transport = self._transport
        if not self.reading_paused and transport is not None and not transport.is_closing():
            self.reading_paused = True
            transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self._transport is not None:
            self.reading_paused = False
            if not self._transport.is_closing():
                self._transport.resume_reading()

    def fail(self, exc: Exception) -> None:
        """End the exchange with `exc` (the watchdog's timeout): the sink hears it, the
        connection is aborted."""
        self._fail(exc)

    def close(self) -> None:
        """Abort now, unread bytes and all: the backend sees the connection go at once."""
        self._set_sink(None)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    async def wait_closed(self) -> None:
        if self._state is _State.CLOSED:
            return
        if self._closed_waiter is None:
            self._closed_waiter = self._loop.create_future()
        await self._closed_waiter

    def released(self) -> None:
        """The response was read to its end and the connection goes back to the pool."""
        self._state = _State.IDLE
        self._set_sink(None)
        self._drop_steady()
        self.resume_reading()  # idle: a close by the upstream must be seen

    # --- internal --------------------------------------------------------------------------------

    def _parser_failed(self, exc: httptools.HttpParserError | httptools.HttpParserUpgrade) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            # llhttp stops at a switch of protocols: a 101 is refused at its head, but nothing
            # the upstream sends may leave `data_received` as an exception.
            self._fail(BadResponse("malformed response: the upstream switched protocols"))
        elif isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__
            if isinstance(cause, BadResponse):
                self._fail(cause)  # a head the callbacks refused
            else:
                # A sink guards its own callbacks; this is the connection's own bug.
                cause = cause if isinstance(cause, Exception) else exc
                self._fail(BadResponse(f"response handling failed: {cause!r}"))
        else:
            self._fail(BadResponse(f"malformed response: {exc}"))

    def _fail(self, exc: Exception) -> None:
        state = self._state
        self._state = _State.CLOSED
        if state is _State.HEAD:
            waiter = self._head_waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
        elif state is _State.BODY:
            self._deliver_error(exc)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def _deliver_read(self) -> None:
        read = self._read
        if not read:
            return
        data = read[0] if len(read) == 1 else b"".join(read)
        read.clear()
        on_data = self._on_data
        if on_data is not None:
            on_data(data)
        elif self._state is not _State.CLOSED:
            self._pending.append(data)

    def _set_sink(self, sink: BodySink | None) -> None:
        self._sink = sink
        self._on_data = None if sink is None else sink.on_data
        # The step's bytes were for the sink that armed it; another one gets them declined.
        if self._steady is not None:
            self._steady.stop()
        self._steady_write = None

    def _take_over(self) -> None:
        if self._state is _State.BODY and self._steady is None and NATIVE is not None:
            self._steady = NATIVE.Step()

    def _drop_steady(self) -> None:
        steady, self._steady = self._steady, None
        if steady is not None:
            self._received += steady.received
        self._native_wanted = self._at_boundary = False

    def _steady_declined(self, steady: Step) -> None:
        """A read the step did not take: its body to the sink, as llhttp would have delivered
        it, and the framing the step left from a chunk boundary on (`rest`) to llhttp."""
        body, rest = steady.body, steady.rest
        if body:
            self._read.append(body)
        if rest:
            self._drop_steady()  # llhttp frames the rest of this message
            try:
                if steady.malformed:
                    raise _malformed_chunk_end(rest)
                self._parser.feed_data(rest)
            except httptools.HttpParserError as exc:
                self._deliver_read()
                self._parser_failed(exc)
                return
        self._deliver_read()

    def _deliver_end(self) -> None:
        sink = self._sink
        if sink is None:
            self._ended = True
        else:
            sink.on_end()

    def _deliver_error(self, exc: Exception) -> None:
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
            return
        sink = self._sink
        self._set_sink(None)
        if sink is None:
            self._error = exc
        else:
            sink.on_error(exc)


def _plainly_chunked(raw: tuple[tuple[bytes, bytes], ...]) -> bool:
    """One `Transfer-Encoding: chunked` and no `Content-Length`: framing llhttp reads as
    chunked whatever its leniencies (RFC 9112 §6.1, §6.3)."""
    codings = [value for name, value in raw if name.lower() == b"transfer-encoding"]
    lengths = [name for name, _ in raw if name.lower() == b"content-length"]
    return not lengths and len(codings) == 1 and codings[0].strip().lower() == b"chunked"


class _Nothing:
    """A parser protocol with no callbacks."""


def _malformed_chunk_end(rest: bytes) -> httptools.HttpParserError:
    """llhttp's own error for a chunk's data not followed by CRLF (`rest` starts where it was
    due): the step found it, llhttp words it."""
    parser = httptools.HttpResponseParser(_Nothing())
    try:
        parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n-" + rest)
    except httptools.HttpParserError as exc:
        return exc
    return httptools.HttpParserError("invalid chunk end")
