"""Transparent pass-through: anything that is not Codec goes upstream and back unchanged.

No parsing on this path: request bytes go up as received, the upstream's status, end-to-end
headers and body bytes come back as sent (compressed bodies stay compressed: nothing here
decodes them). Only hop-by-hop headers are dropped (RFC 9110 §7.6.1).

The response is started only when the first body bytes arrive, so an upstream that times out
before sending anything still gets its client a clean 504; after that, a failure can only
close the connection (the client must not mistake a truncated body for a whole one).
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.bodies import RelayedBody
from proxy.core.http.content_coding import coding_label
from proxy.server.control.exchanges import stream_context, upstream_exchange
from proxy.server.control.headers import forward_headers, request_target, upstream_response_headers
from proxy.server.control.request_body import read_request_body
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.stream import stream_response


async def relay_response(
    request: web.Request, context: StreamContext, exchange: Exchange
) -> web.StreamResponse:
    """Copy an upstream response to the client: status, end-to-end headers, body bytes."""
    head = exchange.head
    context.record.phase = "first_byte"

    def start() -> web.StreamResponse:
        response = web.StreamResponse(status=head.status, reason=head.reason)
        for name, value in upstream_response_headers(head, drop=("content-length",)):
            response.headers.add(name, value)
        if head.content_length is not None:
            response.content_length = head.content_length
        return response

    encoding = coding_label(head.headers.get("Content-Encoding"))
    response, _ = await stream_response(
        request, context, exchange, RelayedBody(), start, encoding=encoding
    )
    return response


async def relay(
    request: web.Request, *, body: bytes | None = None, drop: tuple[str, ...] = ()
) -> web.StreamResponse:
    """Send the request upstream as it is and the answer back as it is."""
    data = body if body is not None else await read_request_body(request)
    context = stream_context(request, "passthrough")
    async with upstream_exchange(
        request,
        context,
        method=request.method,
        path_qs=request_target(request),
        headers=forward_headers(request, drop=drop),
        body=data or None,
    ) as exchange:
        return await relay_response(request, context, exchange)
