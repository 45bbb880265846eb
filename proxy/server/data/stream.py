"""One upstream response streamed to one client, driven by callbacks.

Every streamed answer (pass-through, policed JSON, Codec) is an upstream exchange, a
`ResponseBody` (proxy/core/bodies.py) and a client connection. Once the response has started,
what each upstream read brings goes

    socket read → llhttp (upstream_protocol.py) → `on_data`, once per read → `body.feed` →
    framing → client transport `write`

inside the one read callback: no coroutine is resumed and no task switches per event. The
handler's task waits on one future for the whole stream and wakes once, at its end.
`ResponseStream`'s docstring has what each event does in each phase. Once the response has
started and the body is steady, the native step (proxy/core/steady) takes such a read whole in
the upstream connection's `data_received` and writes what it makes itself; `on_data` then sees
only the reads it declines, after its counters are folded back (`_fold`), and arms it again
(`_arm_native`).

* **Before the response starts** the body is fed until it is `ready` (its status and headers
  can be decided; the first read fed a few KiB at a time so the first frame is not held up by
  the rest), then the handler prepares the response (aiohttp's `on_response_prepare` hooks
  are coroutines) while what arrives meanwhile is kept, as it came, for when streaming starts
  (past `_READY_BUFFER_BYTES` the upstream is paused). A failure up to then is still a clean
  502/504.
* **Backpressure** (`FlowControl`, flow.py): when the client's transport asks to pause
  writing, reading the upstream pauses, and resumes with it; the write timeout is one timer
  started on the pause. A client that does not read for `write_timeout` is dropped (its
  connection aborted, not closed).
* **Timers**: the body's flush deadline (compressed Codec streams) is one timer, re-armed only
  when the deadline moves; the upstream's first-byte/idle watchdog is the exchange's.
* **Ends**: the upstream's end flushes the body; a failure mid-body ends it the way its kind can
  (`body.fail`: a terminal Codec frame) or closes the connection (a truncated JSON body must not
  look whole); a bug in a callback does the same and is logged with the request id; the drain
  timeout ends the stream with `body.fail("proxy shutting down")`; a client that leaves closes
  the upstream at once (the backend stops generating).
* **Accounting** per stream, published once: bytes, time to first byte, the gaps between
  writes (`LocalHistogram`), the body's mean cost per feed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Final

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from proxy.core.bodies import ResponseBody
from proxy.core.errors import ProxyError
from proxy.core.http.framing import BodyFramer, Framing
from proxy.core.steady.bodies import NativeBody, native_body
from proxy.server.data.client_protocol import ProxyProtocol
from proxy.server.data.context import StreamContext
from proxy.server.data.drain import is_shutdown
from proxy.server.data.exchange import Exchange
from proxy.server.data.flow import FlowControl
from proxy.server.data.upstream_protocol import proxy_error
from proxy.server.telemetry.histograms import LocalHistogram

if TYPE_CHECKING:
    from proxy.core.steady._steady import Step

log = logging.getLogger("codec_proxy")

# How much of a first read is fed at a time until the first frame exists: a few events.
_FIRST_READ_SLICE: Final = 4096
# What may arrive while the response is being started before the upstream is paused: a
# pause and a resume are two system calls per stream, and the handler is quick to start.
_READY_BUFFER_BYTES: Final = 64 * 1024
# A write that leaves the transport's buffer below asyncio's low-water mark (16 KiB) cannot
# make aiohttp wait for a drain, so it needs no timer around it.
_NO_WAIT_BELOW: Final = 16 * 1024
# Statuses whose responses have no body (RFC 9112 §6.3).
_NO_BODY_STATUSES: Final = frozenset({204, 304})


class StreamedResponse(web.StreamResponse):
    """A streamed response whose status line and headers leave in one write with its first
    body bytes (aiohttp's default sends them alone, as soon as the response is prepared: one
    more system call per stream, and nothing gained, since the response is only prepared
    once its first bytes are ready)."""

    _send_headers_immediately = False


class StreamEnd(Enum):
    COMPLETE = "complete"  # the body ended (the upstream's end, a terminal frame, a policy stop)
    UPSTREAM_FAILED = "upstream_failed"  # the body could not be ended: the connection closed
    SLOW_CLIENT = "slow_client"  # dropped after write_timeout
    CLIENT_LEFT = "client_left"
    SHUTDOWN = "shutdown"  # ended by the drain timeout


# Ends after which the response is ended properly (its last chunk marker written).
_ENDED_WHOLE: Final = frozenset({StreamEnd.COMPLETE, StreamEnd.SHUTDOWN})


class _Phase(Enum):
    BEFORE = "before"  # feeding until the body is ready
    READY = "ready"  # ready: the handler starts the response
    STREAMING = "streaming"
    ENDED = "ended"


class ResponseStream:
    """The callbacks of one stream. Use `stream_response`.

    Each event, in each phase (→ the phase it leads to; "end": `_finish`, the one way into
    ENDED; "end before the response": `_end_before_response`, the upstream closed and
    `ready` raising, a clean 502/504 or the body's own status; in ENDED every event is
    ignored: nothing more is fed or written, and the upstream waits to be drained or closed):

    event               BEFORE                  READY                   STREAMING
    ------------------  ----------------------  ----------------------  ------------------------
    upstream read       fed in slices until     kept as it came; past   fed, framed, written;
    (`on_data`)         the body is ready       `_READY_BUFFER_BYTES`   the body done: end
                        → READY, the rest kept  the upstream is held    (complete)
    upstream end        flushed into the head   kept                    flushed, the last bytes
    (`on_end`)          → READY, the end kept                           written: end (complete)
    upstream failure    end before the          kept                    `body.fail`: a terminal
    (`on_error`)        response                                        frame, end (complete);
                                                                        else the client closed,
                                                                        end (upstream_failed)
    the body refuses    end before the          (nothing is fed)        as an upstream failure
    its bytes           response
    a bug in a          logged; end before the  logged; the upstream    logged; as an upstream
    callback            response (500)          closed: end             failure
                                                (upstream_failed)
    flush deadline      its bytes into the      (cancelled)             its bytes written, the
                        head; ready → READY                             next one armed
    `run`: the          -                       the head written, what  -
    response starts                             was kept fed, the
                                                upstream read again
                                                → STREAMING
    write timeout       -                       (the head's write) the  the client aborted, the
                                                client aborted, the     upstream closed: end
                                                upstream closed: end    (slow_client)
                                                (slow_client)
    client paused,      (not told)              (not told; `run` looks  `FlowControl`: the
    resumed                                     at the transport)       upstream held and the
                                                                        write timer armed, or
                                                                        both undone
    client lost         (the handler is         (seen by `run`) the     the upstream closed:
                        cancelled)              upstream closed: end    end (client_left)
                                                (client_left)
    drain timeout       (the handler is         (the handler is         the upstream closed;
    (`shutdown`)        cancelled)              cancelled)              `body.fail`: a terminal
                                                                        frame, else the client
                                                                        closed: end (shutdown)
    """

    __slots__ = (
        "_body",
        "_chunked",
        "_client",
        "_context",
        "_deadline_at",
        "_deadline_timer",
        "_done",
        "_end",
        "_exchange",
        "_feed",
        "_feed_seconds",
        "_feeds",
        "_flow",
        "_framer",
        "_gaps",
        "_last_write",
        "_loop",
        "_native",
        "_passes",
        "_pending_end",
        "_pending_error",
        "_phase",
        "_ready",
        "_rest",
        "_rest_bytes",
        "_step",
        "_tail",
        "_timed",
        "_transport",
        "_transport_write",
        "bytes_out",
        "head",
    )

    def __init__(
        self, exchange: Exchange, body: ResponseBody, context: StreamContext, *, timed: bool
    ) -> None:
        self._exchange = exchange
        self._body = body
        self._feed = body.feed
        self._passes = body.passes_through
        self._context = context
        self._timed = timed  # the body's mean cost per chunk is measured (Codec bodies)
        self._loop = loop = asyncio.get_running_loop()
        self._phase = _Phase.BEFORE
        self._ready: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[StreamEnd] = loop.create_future()
        self._end: StreamEnd | None = None
        self.head: list[bytes] = []  # the body's first bytes, made before the response starts
        self._rest: list[bytes] = []
        self._rest_bytes = 0
        self._tail = b""  # the body's last bytes, written with its end marker
        self._pending_end = False
        self._pending_error: Exception | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._flow = FlowControl(
            exchange,
            loop,
            write_timeout=context.write_timeout,
            on_write_timeout=self.drop_slow_client,
        )
        self._client: ProxyProtocol | None = None
        self._transport: asyncio.Transport | None = None
        self._transport_write: Callable[[bytes], object] = _nowhere
        self._framer: BodyFramer | None = None
        self._chunked = False
        self._gaps = LocalHistogram(context.metrics.inter_token_gap.labels(context.mode))
        self._last_write: float | None = None
        self._feed_seconds = 0.0
        self._feeds = 0
        self.bytes_out = 0
        # The native step's binding to this body (proxy/core/steady), and the step once armed.
        self._native: NativeBody | None = native_body(body)
        self._step: Step | None = None

    # --- the upstream's body (BodySink) ----------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        if self._phase is not _Phase.STREAMING:
            self._on_data_before_streaming(data)
            return
        # The steady path, once per upstream chunk: kept to one Python frame (the write and its
        # accounting inline), since it runs for every token of every stream. With the native
        # step armed, only the reads it declines come here.
        native = self._native
        if native is not None:
            self._fold()
        try:
            if self._passes:
                out = data
            else:
                if self._timed:
                    started = time.perf_counter()
                    out = self._feed(data, self._loop.time())
                    self._feed_seconds += time.perf_counter() - started
                    self._feeds += 1
                else:
                    out = self._feed(data, self._loop.time())
                if self._body.done:
                    self._end_whole(out)
                    return
                if not out:
                    if self._deadline_timer is None:
                        self._arm_deadline()  # frames wait for their flush window
                    return
            if self._chunked:
                # `BodyFramer.frame`'s chunk, inlined: `out` is never empty here.
                self._transport_write(b"%x\r\n%b\r\n" % (len(out), out))
            else:
                self._write_framed(out)
            self.bytes_out += len(out)
            now = self._loop.time()
            last = self._last_write
            self._last_write = now
            if last is None:
                self._first_write()
            else:
                self._gaps.observe(now - last)
        except ProxyError as failure:
            self._failed(failure)
        except Exception as exc:
            self._crashed(exc)
        finally:
            if native is not None and self._phase is _Phase.STREAMING:
                self._arm_native()

    def _on_data_before_streaming(self, data: bytes) -> None:
        try:
            phase = self._phase
            if phase is _Phase.BEFORE:
                self._before_ready(data)
            elif phase is _Phase.READY:
                # What arrives while the response is being started is fed chunk by chunk
                # later, as it came: a Codec body makes one frame per feed.
                self._rest.append(data)
                self._rest_bytes += len(data)
                if self._rest_bytes > _READY_BUFFER_BYTES:
                    self._flow.hold()
        except ProxyError as failure:
            self._failed(failure)
        except Exception as exc:
            self._crashed(exc)

    def on_end(self) -> None:
        self._fold()
        try:
            phase = self._phase
            if phase is _Phase.STREAMING:
                self._end_whole(self._body.flush(self._loop.time()))
            elif phase is _Phase.BEFORE:
                self.head.append(self._body.flush(self._loop.time()))
                self._pending_end = True
                self._become_ready()
            elif phase is _Phase.READY:
                self._pending_end = True
        except ProxyError as failure:
            self._failed(failure)
        except Exception as exc:
            self._crashed(exc)

    def on_error(self, exc: Exception) -> None:
        self._fold()
        try:
            phase = self._phase
            if phase is _Phase.STREAMING:
                self._upstream_failed(exc)
            elif phase is _Phase.BEFORE:
                failure = proxy_error(exc, "before the response started")
                self._end_before_response(failure)
            elif phase is _Phase.READY:
                self._pending_error = exc
        except ProxyError as failure:
            self._failed(failure)
        except Exception as crash:
            self._crashed(crash)

    # --- the client's connection (ClientListener) ------------------------------------------------

    def client_paused(self) -> None:
        if self._phase is _Phase.STREAMING:
            self._flow.pause_client()

    def client_resumed(self) -> None:
        if self._phase is _Phase.STREAMING:
            self._flow.resume_client()

    def client_lost(self) -> None:
        if self._phase is not _Phase.ENDED:
            # Close the upstream now: the handler's cancellation comes a loop turn later.
            self._exchange.cancel()
            self._finish(StreamEnd.CLIENT_LEFT)

    # --- the handler's side ----------------------------------------------------------------------

    async def ready(self) -> None:
        """Feed until the body is ready. Raises `UpstreamUnavailable` or `UpstreamTimeout`
        (a clean 502/504: nothing has been sent)."""
        self._exchange.attach(self)
        native = self._native
        if native is not None and native.hopeless:
            self._native = None  # e.g. retokenized: its first read decided so; llhttp's
        elif native is not None:
            self._exchange.want_native()
        if self._phase is _Phase.BEFORE:
            self._arm_deadline()
        await self._ready

    async def run(self, request: web.Request, response: web.StreamResponse) -> StreamEnd:
        """Start `response` (prepared) with the head, then stream until the end."""
        head = b"".join(self.head)
        self.head = []
        # The head goes through aiohttp's writer, with the status line and headers in one
        # write; from then on the body is framed here, the way the writer would have.
        transport = request.transport
        if transport is not None and transport.get_write_buffer_size() + len(head) < _NO_WAIT_BELOW:
            await response.write(head)
        else:
            try:
                async with asyncio.timeout(self._context.write_timeout or None):
                    await response.write(head)
            except TimeoutError:
                self.drop_slow_client()
                return self._end or StreamEnd.SLOW_CLIENT
        if head:
            self._accounted(len(head))
        writer = request.writer
        if not isinstance(writer, StreamWriter):
            raise TypeError("streams are written on aiohttp's HTTP/1.1 writer")
        framer = self._framer = BodyFramer.for_response(
            chunked=writer.chunked,
            length=writer.length,
            empty=request.method == "HEAD"
            or response.status in _NO_BODY_STATUSES
            or response.status < 200,
        )
        self._chunked = framer.framing is Framing.CHUNKED
        self._context.record.phase = "streaming"
        protocol = request.protocol
        if not isinstance(protocol, ProxyProtocol):
            raise TypeError("streams are served on codec-proxy's own connections (ProxyRunner)")
        self._client = protocol
        self._transport = transport
        if transport is None or transport.is_closing():
            self.client_lost()  # gone while the response was being started
        else:
            self._transport_write = transport.write
        if self._end is None:
            self._phase = _Phase.STREAMING
            protocol.listener = self
            if protocol.writing_paused:
                self.client_paused()
            self._resume()
        try:
            end = await asyncio.shield(self._done)
        except asyncio.CancelledError as exc:
            shutdown = is_shutdown(exc)
            if not shutdown and self._end in (None, StreamEnd.CLIENT_LEFT):
                self.client_lost()
                raise  # the client left: aiohttp cancelled the handler
            # Ended by the proxy before the cancellation came (a slow client dropped: its
            # connection's loss cancelled the handler), or by the drain timeout: the stream
            # ends as the proxy ended it.
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            if shutdown:
                self.shutdown()
            end = await self._done
        finally:
            if protocol.listener is self:
                protocol.listener = None
            writer.output_size += self.bytes_out
        return end

    async def end_response(self, response: web.StreamResponse) -> None:
        """Write the body's last bytes with its end marker (aiohttp frames both in one write),
        within the write timeout when the write could wait for the client."""
        tail, self._tail = self._tail, b""
        framer = self._framer
        if framer is not None and not self._chunked:
            tail = framer.frame(tail)  # aiohttp frames only chunked ends
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if tail:
            self._accounted(len(tail))
        client = self._client
        paused = client is not None and client.writing_paused
        if not paused and transport.get_write_buffer_size() + len(tail) < _NO_WAIT_BELOW:
            await response.write_eof(tail)
        else:
            try:
                async with asyncio.timeout(self._context.write_timeout or None):
                    await response.write_eof(tail)
            except TimeoutError:
                self.drop_slow_client()
                return
        self._context.record.completed = True

    def shutdown(self) -> None:
        """End the stream now (the drain timeout): a Codec body with its terminal frame."""
        if self._phase is _Phase.ENDED:
            return
        self._exchange.cancel()
        self._fold()
        ending = self._body.fail("proxy shutting down", self._loop.time())
        self._context.record.outcome = "ended_by_shutdown"
        if ending is None:
            self._close_client()
            self._finish(StreamEnd.SHUTDOWN)
        else:
            self._tail = ending
            self._finish(StreamEnd.SHUTDOWN)

    def drop_slow_client(self) -> None:
        """The client did not take our bytes within `write_timeout`: drop it."""
        context = self._context
        context.metrics.timeouts.labels("write").inc()
        context.record.outcome = "slow_client"
        # Abort, not close: a close waits to flush a send queue the client never reads,
        # keeping the socket and its kernel buffers.
        transport = self._transport
        if transport is not None:
            transport.abort()
        self._exchange.cancel()
        self._finish(StreamEnd.SLOW_CLIENT)

    def publish(self, encoding: str) -> None:
        """The stream's accounting, once, at its end."""
        self._fold()
        context = self._context
        metrics = context.metrics
        context.record.bytes_out += self.bytes_out
        self._gaps.publish()
        if self.bytes_out:
            metrics.bytes_out.labels(context.mode, encoding, context.model).inc(self.bytes_out)
        if self._timed and self._feeds:
            metrics.overhead.labels(context.mode, context.model).observe(
                self._feed_seconds / self._feeds
            )
        if self._step is not None and self._step.steady_reads:
            metrics.native_reads.labels(context.mode).inc(self._step.steady_reads)

    # --- internal --------------------------------------------------------------------------------

    def _before_ready(self, data: bytes) -> None:
        body = self._body
        head = self.head
        now = self._loop.time()
        while data and not body.ready:
            head.append(body.feed(data[:_FIRST_READ_SLICE], now))
            data = data[_FIRST_READ_SLICE:]
        if body.ready:
            if data:
                self._rest.append(data)
                self._rest_bytes += len(data)
            self._become_ready()
        elif self._deadline_timer is None:
            self._arm_deadline()

    def _become_ready(self) -> None:
        self._phase = _Phase.READY
        self._cancel_deadline()
        if not self._ready.done():
            self._ready.set_result(None)

    def _resume(self) -> None:
        """Streaming starts: what the first read held beyond the head, what happened while
        the response was being started, then reading again."""
        rest, self._rest = self._rest, []
        for chunk in rest:
            self.on_data(chunk)
            if self._phase is not _Phase.STREAMING:
                return
        if self._pending_error is not None:
            self.on_error(self._pending_error)
        elif self._pending_end:
            self.on_end()
        elif self._body.done:
            self._end_whole(b"")
        else:
            self._arm_deadline()
            if self._native is not None:
                self._arm_native()
            if self._flow.buffering:
                self._flow.release()

    def _arm_native(self) -> None:
        """Hand the next reads to the native step if the body is steady now (after its first
        frame, and again after each read it declined)."""
        native = self._native
        if native is None or self._last_write is None or not self._chunked:
            return  # the step writes chunks; an HTTP/1.0 client or a HEAD answer gets none
        if native.hopeless:
            self._fold()
            self._native = None
            return
        step = self._exchange.steady
        if step is None:
            return  # not at a chunk boundary yet: after the next read
        armed = native.arm(step, self._last_write, self._loop.time, self._gaps.bounds)
        if armed and self._step is None:
            self._step = step
            self._exchange.steady_to(self._native_made if native.hands else self._transport_write)

    def _native_made(self, handed: tuple[int, ...] | str) -> None:
        """What the step handed for a steady read (a compressed body's IDs, a retokenized
        stream's text), made into bytes by the body: what `on_data` does with them."""
        native = self._native
        if native is None:
            return
        try:
            out = native.made(handed, self._loop.time())
            if self._body.done:
                self._end_whole(out)  # text no token spells: the terminal frame went out
                return
            if not out:
                if self._deadline_timer is None:
                    self._arm_deadline()  # frames wait for their flush window
                return
            self._transport_write(b"%x\r\n%b\r\n" % (len(out), out))
            self._accounted(len(out))
        except ProxyError as failure:
            self._failed(failure)
        except Exception as exc:
            self._crashed(exc)

    def _fold(self) -> None:
        """What the step wrote and counted, into this stream and its body's objects: before
        any of them is used again."""
        native, step = self._native, self._step
        if native is None or step is None:
            return
        writes = native.fold(step)
        if writes.bytes_out:
            self.bytes_out += writes.bytes_out
            self._gaps.add(writes.gap_counts, writes.gap_sum)
            self._last_write = writes.last_write

    def _write(self, data: bytes) -> None:
        """Write body bytes outside the steady path (a flush deadline), framed and accounted
        like `on_data` does inline."""
        if self._transport is None:
            return
        self._write_framed(data)
        self._accounted(len(data))

    def _write_framed(self, data: bytes) -> None:
        framer = self._framer
        framed = framer.frame(data) if framer is not None else data
        if framed:
            self._transport_write(framed)

    def _accounted(self, size: int) -> None:
        self.bytes_out += size
        now = self._loop.time()
        last = self._last_write
        self._last_write = now
        if last is None:
            self._first_write()
        else:
            self._gaps.observe(now - last)

    def _first_write(self) -> None:
        context = self._context
        record = context.record
        record.ttft = time.monotonic() - record.started
        context.metrics.ttft.labels(context.mode, context.model).observe(record.ttft)

    def _end_whole(self, tail: bytes) -> None:
        """The body is whole: its last bytes go out with its end marker."""
        self._tail = tail
        self._finish(StreamEnd.COMPLETE)

    def _arm_deadline(self) -> None:
        when = self._body.deadline()
        if when is None:
            return
        if self._deadline_timer is not None:
            if self._deadline_at <= when:
                return
            self._deadline_timer.cancel()
        self._deadline_at = when
        self._deadline_timer = self._loop.call_at(when, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._deadline_timer = None
        self._fold()
        try:
            now = self._loop.time()
            if self._phase is _Phase.STREAMING:
                out = self._body.on_deadline(now)
                if out:
                    self._write(out)
                self._arm_deadline()
            elif self._phase is _Phase.BEFORE:
                self.head.append(self._body.on_deadline(now))
                if self._body.ready:
                    self._become_ready()
                else:
                    self._arm_deadline()
        except ProxyError as failure:
            self._failed(failure)
        except Exception as exc:
            self._crashed(exc)

    def _failed(self, failure: ProxyError) -> None:
        """What the body found wrong with the upstream's bytes (a protocol error, a lone
        surrogate, an event too large): an upstream failure, never the proxy's bug."""
        self._fold()
        try:
            if self._phase is _Phase.STREAMING:
                self._upstream_failed(failure)
            elif self._phase is not _Phase.ENDED:
                self._end_before_response(failure)  # its status: a clean HTTP error
        except Exception as exc:
            self._crashed(exc)

    def _upstream_failed(self, exc: Exception) -> None:
        context = self._context
        ending = self._body.fail(f"upstream failed mid-stream: {exc}", self._loop.time())
        if ending is None:
            # The status line is gone: close the connection rather than end the body cleanly,
            # so the client cannot take a truncated body for a whole one.
            context.record.outcome = f"upstream_failed: {type(exc).__name__}"
            self._close_client()
            self._finish(StreamEnd.UPSTREAM_FAILED)
            return
        self._end_whole(ending)

    def _crashed(self, exc: Exception) -> None:
        """A bug in a callback: logged with the request, and the stream ended the way an
        upstream failure would end it (asyncio would only log it and drop the connection)."""
        self._fold()
        record = self._context.record
        log.error("stream of request %s failed", record.id, exc_info=exc)
        record.outcome = "internal_error"
        if self._phase is not _Phase.STREAMING:
            self._end_before_response(exc)
            return
        self._exchange.cancel()
        try:
            ending = self._body.fail("internal error", self._loop.time())
        except Exception as again:
            log.error("ending the stream of request %s failed", record.id, exc_info=again)
            ending = None
        if ending is None:
            self._close_client()
            self._finish(StreamEnd.UPSTREAM_FAILED)
        else:
            self._end_whole(ending)

    def _close_client(self) -> None:
        client = self._client
        if client is not None:
            client.force_close()
        if self._transport is not None:
            self._transport.close()

    def _end_before_response(self, error: Exception) -> None:
        """The one way a stream ends before its response starts: the upstream is closed (the
        backend stops), and the handler's `ready` raises `error`, a clean HTTP error when it
        is the proxy's."""
        self._exchange.cancel()
        if not self._ready.done():
            self._ready.set_exception(error)
        self._finish(StreamEnd.UPSTREAM_FAILED)

    def _finish(self, end: StreamEnd) -> None:
        if self._phase is _Phase.ENDED:
            return
        self._phase = _Phase.ENDED
        self._end = end
        self._cancel_deadline()
        # Nothing more is fed: the control plane drains or cancels what is left upstream.
        self._flow.end()
        self._exchange.detach()
        if not self._done.done():
            self._done.set_result(end)

    def _cancel_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None


def _nowhere(data: bytes) -> None:
    """Where body bytes go before the client's transport is known: nowhere (never called)."""


async def stream_response(
    request: web.Request,
    context: StreamContext,
    exchange: Exchange,
    body: ResponseBody,
    start: Callable[[], web.StreamResponse],
    *,
    encoding: str = "identity",
    timed: bool = False,
) -> tuple[web.StreamResponse, StreamEnd]:
    """Stream `exchange`'s body through `body` to the client; `start()` makes the response
    (a `StreamedResponse`) once the body is ready. Returns it sent in full, or with its
    connection closed (the upstream broke mid-body, or the client stopped reading for
    `write_timeout`), and how the stream ended. `timed`: measure the body's mean cost per
    upstream chunk (`codec_proxy_overhead_seconds`)."""
    stream = ResponseStream(exchange, body, context, timed=timed)
    await stream.ready()
    response = start()
    await response.prepare(request)
    try:
        end = await stream.run(request, response)
        if end in _ENDED_WHOLE:
            await stream.end_response(response)
    finally:
        stream.publish(encoding)
    if end is StreamEnd.CLIENT_LEFT:
        raise ConnectionResetError("the client closed the connection")
    context.record.status = response.status
    return response, end
