"""`/.well-known/codec/`: the proxy's tokenizer map and the index, for any client, CORS-simple.

No Codec request header is needed (a browser's plain GET), every answer allows any origin,
and the documents come from memory (`MapStore`): the path only ever selects one of them.
"""

from __future__ import annotations

import hashlib

from aiohttp import web

from proxy.core.discovery import (
    CORS_ALLOW_ORIGIN,
    IMMUTABLE_CACHE_CONTROL,
    PREFLIGHT_HEADERS,
    SHORT_CACHE_CONTROL,
    IndexDocument,
    MapByDigest,
    MapById,
    choose_coding,
    discovery_target,
    entity_tag,
    if_none_match,
    index_body,
    origin_of,
    reply_headers,
)
from proxy.core.tokenizer_map import PublishedMap
from proxy.server.errors import json_error
from proxy.server.keys import MAPS
from proxy.server.map_store import COMPRESSORS

ALLOWED_METHODS = "GET, HEAD, OPTIONS"


def _not_found(request: web.Request) -> web.Response:
    response = json_error(
        404,
        f"no Codec discovery document at {request.raw_path.partition('?')[0]}",
        error_type="not_found_error",
        code="not_found",
    )
    response.headers.update([CORS_ALLOW_ORIGIN])
    return response


def _reply(
    request: web.Request, body: bytes, digest: str, cache_control: str, coded: bytes | None
) -> web.Response:
    """200 with `coded` (if the client takes a coding) or `body`, or 304; same headers."""
    coding = choose_coding(request.headers.get("Accept-Encoding")) if coded is not None else None
    headers = reply_headers(digest, cache_control, coding)
    if if_none_match(request.headers.get("If-None-Match"), entity_tag(digest)):
        return web.Response(status=304, headers=headers)
    return web.Response(body=coded if coded is not None else body, headers=headers)


async def _map_reply(
    request: web.Request, published: PublishedMap, cache_control: str
) -> web.Response:
    coding = choose_coding(request.headers.get("Accept-Encoding"))
    coded = None if coding is None else await request.app[MAPS].encoded(published, coding)
    return _reply(request, published.body, published.digest, cache_control, coded)


def _index_reply(request: web.Request) -> web.Response:
    origin = origin_of(request.scheme, request.host)
    if origin is None:
        return _not_found(request)
    body = index_body(origin, request.app[MAPS].maps)
    # A few hundred bytes: compressed inline, not kept (it names the request's origin).
    coding = choose_coding(request.headers.get("Accept-Encoding"))
    coded = None if coding is None else COMPRESSORS[coding](body)
    digest = hashlib.sha256(body).hexdigest()
    return _reply(request, body, digest, SHORT_CACHE_CONTROL, coded)


async def well_known(request: web.Request) -> web.StreamResponse:
    """Every method on `/.well-known/codec/...`; nothing under it is relayed upstream."""
    if request.method == "OPTIONS":
        return web.Response(status=204, headers=PREFLIGHT_HEADERS)
    if request.method not in ("GET", "HEAD"):
        response = json_error(
            405,
            f"{request.method} is not allowed on discovery documents",
            error_type="invalid_request_error",
            code="method_not_allowed",
        )
        response.headers.update([("Allow", ALLOWED_METHODS), CORS_ALLOW_ORIGIN])
        return response
    store = request.app[MAPS]
    target = discovery_target(request.raw_path)
    if isinstance(target, IndexDocument):
        return _index_reply(request)
    if isinstance(target, MapById) and (published := store.by_id(target.map_id)) is not None:
        return await _map_reply(request, published, SHORT_CACHE_CONTROL)
    if (
        isinstance(target, MapByDigest)
        and (published := store.by_digest(target.digest)) is not None
    ):
        return await _map_reply(request, published, IMMUTABLE_CACHE_CONTROL)
    return _not_found(request)
