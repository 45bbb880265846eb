"""One upstream exchange, one client response: every streamed answer goes through here.

Pass-through, policed JSON and Codec differ only in their `ResponseBody` (proxy/core/bodies.py)
and their headers. What they share is done once, here:

* `upstream_exchange`: the request goes upstream through the pool; the request record, the
  active-streams gauge and the drain's stream tracking follow it; the response is released
  however the exchange ends.
* `stream_response`: read until the body is ready (a failure up to then is still a clean 502 or
  504), start the response, then pump: read with the body's deadline, write what it makes,
  end it once. A failure mid-body ends the body the way its kind can (a terminal Codec frame)
  or closes the connection (a truncated JSON body must not look whole).
* `ClientWriter`: awaited writes (a slow client slows the upstream reads instead of being
  buffered, peers.md A10), dropped after `write_timeout`, accounted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import Histogram

from proxy.core.bodies import ResponseBody
from proxy.core.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.data.drain import LIFECYCLE, is_shutdown
from proxy.server.data.pool import Exchange
from proxy.server.models.live import config_of
from proxy.server.models.served_models import model_label, model_of
from proxy.server.telemetry.metrics import METRICS, Metrics
from proxy.server.telemetry.record import RECORD, RequestRecord

log = logging.getLogger("codec_proxy")


@contextlib.asynccontextmanager
async def upstream_exchange(
    request: web.Request,
    *,
    mode: str,
    method: str,
    path_qs: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
) -> AsyncIterator[Exchange]:
    """The upstream request of one client request, tracked and accounted; yields once the
    upstream's response headers are in."""
    app = request.app
    record = request[RECORD]
    record.mode = mode
    record.phase = "upstream_headers"
    model = model_of(request)
    active = app[METRICS].active_streams.labels(mode, model.name)
    active.inc()
    try:
        with app[LIFECYCLE].tracking():
            async with model.pool.open(method, path_qs, headers=headers, data=body) as exchange:
                record.upstream = exchange.upstream.url
                try:
                    yield exchange
                finally:
                    # Also when the client hangs up while the rest of the body is drained.
                    record.bytes_in = exchange.bytes_in
                    app[METRICS].bytes_in.labels(mode, model.name).inc(exchange.bytes_in)
    finally:
        active.dec()


class ClientStalled(ConnectionResetError):
    """The client did not take our bytes within the write timeout; it is dropped."""


# A write that leaves the transport's buffer below asyncio's low-water mark (16 KiB) cannot
# make aiohttp wait for a drain, so it needs no write timeout around it: the common case, one
# small frame or event at a time.
_NO_WAIT_BELOW = 16 * 1024


class ClientWriter:
    """Writes to one client: awaited (backpressure), bounded in time, accounted once."""

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        *,
        metrics: Metrics,
        record: RequestRecord,
        write_timeout: float,
        encoding: str = "identity",
    ) -> None:
        self._request = request
        self._response = response
        self._metrics = metrics
        self._record = record
        self._timeout = write_timeout or None
        self._encoding = encoding
        self._gap = metrics.inter_token_gap.labels(record.mode)
        self._model = model_label(request)

    async def write(self, data: bytes) -> None:
        if not data:
            return
        transport = self._request.transport
        if transport is not None and transport.get_write_buffer_size() + len(data) < _NO_WAIT_BELOW:
            await self._response.write(data)
        else:
            await self._write_in_time(data)
        first = self._record.ttft is None
        gap = self._record.wrote(len(data), time.monotonic())
        if first and self._record.ttft is not None:
            self._metrics.ttft.labels(self._record.mode, self._model).observe(self._record.ttft)
        elif gap is not None:
            self._gap.observe(gap)

    async def _write_in_time(self, data: bytes) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._response.write(data)
        except TimeoutError as exc:
            self._metrics.timeouts.labels("write").inc()
            self._record.outcome = "slow_client"
            # Abort, not close: a close waits to flush a send queue the client never reads,
            # keeping the socket and its kernel buffers.
            if self._request.transport is not None:
                self._request.transport.abort()
            raise ClientStalled("client stopped reading") from exc

    def account(self) -> None:
        """Publish the bytes sent, once per response rather than once per write."""
        if self._record.bytes_out:
            labels = self._metrics.bytes_out.labels(self._record.mode, self._encoding, self._model)
            labels.inc(self._record.bytes_out)

    async def close(self) -> None:
        async with asyncio.timeout(self._timeout):
            await self._response.write_eof()
        self._record.status = self._response.status
        self._record.completed = True


# How much of a first read is fed at a time until the first frame exists: a few events.
_FIRST_READ_SLICE = 4096


@dataclass(slots=True)
class _Cost:
    seconds: float = 0.0
    chunks: int = 0


async def stream_response(
    request: web.Request,
    exchange: Exchange,
    body: ResponseBody,
    start: Callable[[], web.StreamResponse],
    *,
    encoding: str = "identity",
    overhead: Histogram | None = None,
) -> web.StreamResponse:
    """Stream `exchange`'s body through `body` to the client; `start()` makes the response
    once the body is ready. Returns it sent in full, or with its connection closed (the
    upstream broke mid-body, or the client stopped reading for `write_timeout`)."""
    app = request.app
    record = request[RECORD]
    loop = asyncio.get_running_loop()
    head = rest = b""
    ended = False
    while not body.ready:
        try:
            chunk = await exchange.read(body.deadline())
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(
                f"upstream failed before the response started: {exc}"
            ) from exc
        now = loop.time()
        if chunk is None:
            head += body.on_deadline(now)
        elif chunk:
            # A large first read (a fast upstream, a long prompt echo) is fed a slice at a
            # time until the body is ready, so the first frame goes out as soon as it is made;
            # the rest is fed once it is on its way.
            while chunk and not body.ready:
                head += body.feed(chunk[:_FIRST_READ_SLICE], now)
                chunk = chunk[_FIRST_READ_SLICE:]
            rest = chunk
        else:
            head += body.flush(now)
            ended = True
    response = start()
    await response.prepare(request)
    writer = ClientWriter(
        request,
        response,
        metrics=app[METRICS],
        record=record,
        write_timeout=config_of(request).settings.write_timeout,
        encoding=encoding,
    )
    record.phase = "streaming"
    # Transcoding time per upstream chunk, published once per stream as its mean: observing a
    # histogram per chunk cost more than most of what it measured.
    cost = _Cost()
    try:
        await _pump(request, exchange, body, writer, head, rest, ended, cost)
    finally:
        writer.account()
        if overhead is not None and cost.chunks:
            overhead.observe(cost.seconds / cost.chunks)
    return response


async def _pump(
    request: web.Request,
    exchange: Exchange,
    body: ResponseBody,
    writer: ClientWriter,
    head: bytes,
    rest: bytes,
    ended: bool,
    cost: _Cost,
) -> None:
    """Write `head`, feed `rest` (what the first read held beyond it), then read, transform
    and write until the body is done."""
    app = request.app
    record = request[RECORD]
    loop = asyncio.get_running_loop()
    try:
        await writer.write(head)
        while not (ended or body.done):
            # Only the upstream side is guarded: a failed write means the client left, and
            # that must propagate so the upstream request is closed and the backend stops.
            try:
                chunk: bytes | None
                if rest:
                    chunk, rest = rest, b""
                else:
                    chunk = await exchange.read(body.deadline())
                now = loop.time()
                if chunk is None:
                    data = body.on_deadline(now)
                elif chunk:
                    started = time.perf_counter()
                    data = body.feed(chunk, now)
                    cost.seconds += time.perf_counter() - started
                    cost.chunks += 1
                else:
                    data, ended = body.flush(now), True
            except (aiohttp.ClientError, ProxyError) as exc:
                if isinstance(exc, UpstreamTimeout):
                    app[METRICS].timeouts.labels("idle").inc()
                ending = body.fail(f"upstream failed mid-stream: {exc}", loop.time())
                if ending is None:
                    # The status line is gone: close the connection rather than end the body
                    # cleanly, so the client cannot take a truncated body for a whole one.
                    record.outcome = f"upstream_failed: {type(exc).__name__}"
                    if request.transport is not None:
                        request.transport.close()
                    return
                data, ended = ending, True
            await writer.write(data)
    except ClientStalled:
        return  # dropped: its connection is aborted, the exchange closes upstream
    except asyncio.CancelledError as exc:
        ending = body.fail("proxy shutting down", loop.time()) if is_shutdown(exc) else None
        if ending is None:
            raise
        # The drain timeout ran out: end the body properly, then finish normally.
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        record.outcome = "ended_by_shutdown"
        await writer.write(ending)
    await writer.close()
