"""Transparent pass-through: anything that is not Codec goes upstream and back unchanged.

No parsing on this path: request bytes go up as received, the upstream's status, end-to-end
headers and body bytes come back as sent (compressed bodies stay compressed; the session has
auto-decompression off). Only hop-by-hop headers are dropped (RFC 9110 §7.6.1).

The response is started only when the first body bytes arrive, so an upstream that times out
before sending anything still gets its client a clean 504; after that, a failure can only
close the connection (the client must not mistake a truncated body for a whole one).
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.bodies import RelayedBody
from proxy.core.http.content_coding import coding_label
from proxy.server.control.headers import forward_headers, request_target, upstream_response_headers
from proxy.server.control.request_body import read_request_body
from proxy.server.data.pool import Exchange
from proxy.server.data.pump import stream_response, upstream_exchange
from proxy.server.telemetry.record import RECORD


async def relay_response(request: web.Request, exchange: Exchange) -> web.StreamResponse:
    """Copy an upstream response to the client: status, end-to-end headers, body bytes."""
    upstream = exchange.response
    request[RECORD].phase = "first_byte"

    def start() -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream_response_headers(upstream, drop=("content-length",)):
            response.headers.add(name, value)
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        return response

    encoding = coding_label(upstream.headers.get("Content-Encoding"))
    return await stream_response(request, exchange, RelayedBody(), start, encoding=encoding)


async def relay(
    request: web.Request, *, body: bytes | None = None, drop: tuple[str, ...] = ()
) -> web.StreamResponse:
    """Send the request upstream as it is and the answer back as it is."""
    data = body if body is not None else await read_request_body(request)
    async with upstream_exchange(
        request,
        mode="passthrough",
        method=request.method,
        path_qs=request_target(request),
        headers=forward_headers(request, drop=drop),
        body=data or None,
    ) as exchange:
        return await relay_response(request, exchange)
