"""Reading a request body, bounded in time: the one way every handler reads one.

A client that sends its head and then stalls mid-body (slowloris) would otherwise hold its
connection and the part of the body already buffered for as long as it likes. The body must
arrive within `request_timeout` of the handler starting to read it, which is when its head was
complete; else 408 (RFC 9110 §15.5.9), and the connection closes once that is written (the
rest of the body is not awaited). How long a request head may take is bounded by the connection
itself: the keep-alive timer `create_app` sets (proxy/server/app.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.core.errors import BadRequest, ProxyError
from proxy.core.shown import clipped
from proxy.server.data.client_protocol import ProxyProtocol
from proxy.server.models.live import config_of
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD


class RequestTimeout(ProxyError):
    """The request body did not arrive within `request_timeout` (408)."""

    status_hint = 408
    error_type = "invalid_request_error"


async def read_request_body(request: web.Request) -> bytes:
    """The whole body as sent (aiohttp caps it at `client_max_size`: 413 beyond)."""
    timeout = config_of(request).settings.request_timeout
    try:
        if request.content.is_eof():
            # The whole body came with the head (most requests): nothing is waited for, so no
            # timer is armed and cancelled for it.
            return await request.read()
        async with asyncio.timeout(timeout or None):
            return await request.read()
    except TimeoutError as exc:
        request[RECORD].outcome = "request_timeout"
        request.app[METRICS].timeouts.labels("request_body").inc()
        if isinstance(request.protocol, ProxyProtocol):
            request.protocol.close_after_response()
        raise RequestTimeout(
            f"the request body did not arrive within {timeout:g} s", code="request_timeout"
        ) from exc
    except web.RequestPayloadError as exc:
        # A chunked body that breaks its framing: where the next request starts is lost too.
        if isinstance(request.protocol, ProxyProtocol):
            request.protocol.close_after_response()
        # The parser's message quotes the bytes it failed on.
        raise BadRequest(
            f"malformed request body: {clipped(str(exc))}", code="malformed_body"
        ) from exc
