"""Transparent pass-through: anything that is not Codec goes upstream and back unchanged.

No parsing on this path: request bytes go up as received, the upstream's status, end-to-end
headers and body bytes come back as sent (compressed bodies stay compressed: nothing here
decodes them). Only hop-by-hop headers are dropped (RFC 9110 §7.6.1). With `json_compression`
on, a JSON response the upstream sent uncompressed is compressed for a client that accepts it
(json_compression.py): the bytes it decodes are still the upstream's.

The response is started only when the first body bytes arrive, so an upstream that times out
before sending anything still gets its client a clean 504; after that, a failure can only
close the connection (the client must not mistake a truncated body for a whole one).
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.bodies import CompressedWholeBody, RelayedBody, ResponseBody
from proxy.core.http.content_coding import coding_label
from proxy.server.control.exchanges import stream_context
from proxy.server.control.headers import forward_headers, request_target, upstream_response_headers
from proxy.server.control.json_compression import json_compression
from proxy.server.control.request_body import read_request_body
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.stream import StreamedResponse, stream_response
from proxy.server.models.served_models import model_of


async def relay_response(
    request: web.Request, context: StreamContext, exchange: Exchange
) -> web.StreamResponse:
    """Copy an upstream response to the client: status, end-to-end headers, body bytes."""
    head = exchange.head
    context.record.phase = "first_byte"
    compression = json_compression(request, head)
    coded = compression is not None and compression.coded
    body: ResponseBody = RelayedBody()
    encoding = coding_label(head.headers.get("Content-Encoding"))
    if compression is not None and compression.coded:
        context.record.encoding = encoding = compression.coding
        if request.method != "HEAD":
            # A HEAD answer has no content to code, only the headers its GET would get.
            body = compression.body(RelayedBody())

    def start() -> web.StreamResponse:
        response = StreamedResponse(status=head.status, reason=head.reason)
        headers = upstream_response_headers(head, drop=("content-length",))
        if compression is not None:
            headers = compression.headers(headers)
        for name, value in headers:
            response.headers.add(name, value)
        length = head.content_length
        if coded:
            length = body.length if isinstance(body, CompressedWholeBody) else None
        if length is not None:
            response.content_length = length
        return response

    response, _ = await stream_response(request, context, exchange, body, start, encoding=encoding)
    return response


async def relay(
    request: web.Request,
    *,
    body: bytes | None = None,
    drop: tuple[str, ...] = (),
    mode: str = "passthrough",
) -> web.StreamResponse:
    """Send the request upstream as it is and the answer back as it is. `mode`: the
    stream's label in metrics and the access log."""
    data = body if body is not None else await read_request_body(request)
    context = stream_context(request, mode)
    async with model_of(request).pool.open(
        context,
        method=request.method,
        path_qs=request_target(request),
        headers=forward_headers(request, drop=drop),
        body=data or None,
    ) as exchange:
        return await relay_response(request, context, exchange)
