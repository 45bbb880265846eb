"""Transparent pass-through: anything that is not Codec goes upstream and back unchanged.

No parsing on this path: request bytes go up as received, the upstream's status, end-to-end
headers and body bytes come back as sent (compressed bodies stay compressed; the session has
auto-decompression off). Only hop-by-hop headers are dropped (RFC 9110 §7.6.1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from proxy.core.errors import UpstreamTimeout, UpstreamUnavailable
from proxy.core.headers import end_to_end
from proxy.server.keys import UPSTREAM
from proxy.server.upstream import Upstream

# Set by the upstream client from the URL and the body; never copied from the client's request.
_REQUEST_DROP = ("host", "content-length")


def request_target(request: web.Request) -> str:
    """Path and query exactly as the client wrote them (yarl would re-quote the query)."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


def forward_headers(request: web.Request, *, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
    return end_to_end(raw, drop=_REQUEST_DROP + drop)


@asynccontextmanager
async def upstream_call(
    upstream: Upstream,
    method: str,
    path_qs: str,
    *,
    headers: list[tuple[str, str]],
    data: bytes | None,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """Open an upstream response; failures before it starts become 502/504 errors, once."""
    try:
        response = await upstream.request(method, path_qs, headers=headers, data=data)
    except TimeoutError as exc:
        raise UpstreamTimeout(f"upstream did not answer in time: {exc!r}") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(f"upstream unavailable: {exc}") from exc
    try:
        yield response
    finally:
        response.release()


async def relay_response(
    request: web.Request, upstream: aiohttp.ClientResponse
) -> web.StreamResponse:
    """Copy an upstream response to the client: status, end-to-end headers, body bytes."""
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for name, value in end_to_end(raw, drop=("content-length",)):
        response.headers.add(name, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except (TimeoutError, aiohttp.ClientError):
        # The upstream broke mid-body: the status is sent, so close the connection rather
        # than end the body cleanly; the client must not mistake a truncated body for whole.
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


async def relay(request: web.Request, *, body: bytes | None = None) -> web.StreamResponse:
    """Send the request upstream as it is and the answer back as it is."""
    data = body if body is not None else await request.read()
    async with upstream_call(
        request.app[UPSTREAM],
        request.method,
        request_target(request),
        headers=forward_headers(request),
        data=data or None,
    ) as upstream:
        return await relay_response(request, upstream)


async def relay_handler(request: web.Request) -> web.StreamResponse:
    return await relay(request)
