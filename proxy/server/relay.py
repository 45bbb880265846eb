"""Transparent pass-through: anything that is not Codec goes upstream and back unchanged.

No parsing on this path: request bytes go up as received, the upstream's status, end-to-end
headers and body bytes come back as sent (compressed bodies stay compressed; the session has
auto-decompression off). Only hop-by-hop headers are dropped (RFC 9110 §7.6.1).

The response is started only when the first body bytes arrive, so an upstream that times out
before sending anything still gets its client a clean 504; after that, a failure can only
close the connection (the client must not mistake a truncated body for a whole one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.core.errors import ProxyError
from proxy.core.headers import end_to_end
from proxy.server.client_writer import ClientWriter
from proxy.server.keys import LIFECYCLE, METRICS, SETTINGS, UPSTREAM
from proxy.server.observe import RECORD, REQUEST_ID_HEADER
from proxy.server.upstream import Exchange

# Set by the upstream client from the URL and the body; never copied from the client's request.
_REQUEST_DROP = ("host", "content-length")


def request_target(request: web.Request) -> str:
    """Path and query exactly as the client wrote them (yarl would re-quote the query)."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


def forward_headers(request: web.Request, *, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
    headers = end_to_end(raw, drop=(*_REQUEST_DROP, REQUEST_ID_HEADER.lower(), *drop))
    # The request id travels upstream (vLLM logs it), the client's or the one we made up.
    return [*headers, (REQUEST_ID_HEADER, request[RECORD].id)]


async def _first_and_rest(exchange: Exchange) -> tuple[bytes, AsyncIterator[bytes]]:
    chunks = exchange.chunks().__aiter__()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = b""
    return first, chunks


async def relay_response(request: web.Request, exchange: Exchange) -> web.StreamResponse:
    """Copy an upstream response to the client: status, end-to-end headers, body bytes."""
    upstream = exchange.response
    record = request[RECORD]
    record.phase = "first_byte"
    first, rest = await _first_and_rest(exchange)  # a timeout here is still a clean 504
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for name, value in end_to_end(raw, drop=("content-length",)):
        response.headers.add(name, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    writer = ClientWriter(
        request,
        response,
        metrics=request.app[METRICS],
        record=record,
        write_timeout=request.app[SETTINGS].write_timeout,
        encoding=upstream.headers.get("Content-Encoding", "identity"),
    )
    record.phase = "streaming"
    try:
        await writer.write(first)
        async for chunk in rest:
            await writer.write(chunk)
    except (aiohttp.ClientError, ProxyError, TimeoutError) as exc:
        # The upstream broke or went silent mid-body. The status line is gone, so close the
        # connection rather than end the body cleanly.
        record.outcome = f"upstream_failed: {type(exc).__name__}"
        if request.transport is not None:
            request.transport.close()
        return response
    await writer.close()
    return response


async def relay(request: web.Request, *, body: bytes | None = None) -> web.StreamResponse:
    """Send the request upstream as it is and the answer back as it is."""
    data = body if body is not None else await request.read()
    record = request[RECORD]
    record.mode = "passthrough"
    record.phase = "upstream_headers"
    mode_gauge = request.app[METRICS].active_streams.labels("passthrough")
    mode_gauge.inc()
    try:
        with request.app[LIFECYCLE].tracking():
            async with request.app[UPSTREAM].open(
                request.method,
                request_target(request),
                headers=forward_headers(request),
                data=data or None,
            ) as exchange:
                record.upstream = exchange.upstream.url
                response = await relay_response(request, exchange)
                record.bytes_in = exchange.bytes_in
                return response
    finally:
        mode_gauge.dec()


async def relay_handler(request: web.Request) -> web.StreamResponse:
    return await relay(request)
