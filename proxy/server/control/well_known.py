"""Everything under `/.well-known/codec/`: tokenizer maps and their index, zstd dictionaries,
the version policy and the safety-policy descriptor. Answered here, never relayed upstream.

All of it is public and fetched by browsers: no Codec request header is needed (a plain GET),
every answer allows any origin, an OPTIONS preflight is answered (the reference
`discover_version_policy` sends `Codec-Client-Version`), and a miss is the one JSON 404. The
documents come from memory: a path only ever selects one of them (codec-spec.md §3.5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib
from collections.abc import Callable, Sequence

import brotli
from aiohttp import web

from proxy.core.compression.compressors import DEFAULT_LEVELS
from proxy.core.compression.dictionaries import is_sha256_hex
from proxy.core.maps.discovery import (
    CORS_ALLOW_ORIGIN,
    HOST_DERIVED_CACHE_CONTROL,
    IMMUTABLE_CACHE_CONTROL,
    PREFLIGHT_HEADERS,
    SHORT_CACHE_CONTROL,
    WELL_KNOWN_PREFIX,
    Coding,
    IndexDocument,
    IndexEntry,
    MapByDigest,
    MapById,
    MapInline,
    choose_coding,
    discovery_target,
    entity_tag,
    if_none_match,
    index_body,
    is_pointed_to,
    origin_of,
    pointer_body,
    reply_headers,
)
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.core.safety.policy import WELL_KNOWN_POLICIES
from proxy.core.shown import quoted
from proxy.server.control.errors import json_error, method_not_allowed
from proxy.server.control.headers import combined_header
from proxy.server.models.live import config_of
from proxy.server.models.served_models import SERVED_MODELS

VERSION_POLICY_PATH = WELL_KNOWN_PREFIX + "version-policy.json"
ALLOWED_METHODS = "GET, HEAD, OPTIONS"
# The version policy can change with a restart; clients may otherwise keep it for an hour.
_VERSION_POLICY_CACHE = "public, max-age=300"

# Maps are compressed once per map and coding, on first request, in a worker thread: a
# Llama-3 map is 6 MB, and the streaming levels take well under a second for it.
COMPRESSORS: dict[Coding, Callable[[bytes], bytes]] = {
    # mtime=0: the same map compresses to the same bytes on every run.
    "gzip": lambda body: gzip.compress(body, DEFAULT_LEVELS.gzip, mtime=0),
    "br": lambda body: brotli.compress(body, quality=DEFAULT_LEVELS.brotli_quality),
}


class MapStore:
    """The maps this proxy publishes, by id and by digest, their compressed bodies cached."""

    def __init__(self, maps: Sequence[PublishedMap]) -> None:
        self.maps = tuple(maps)
        self._by_id = {published.id: published for published in self.maps}
        self._by_digest = {published.digest: published for published in self.maps}
        self._encoded: dict[tuple[str, Coding], asyncio.Task[bytes]] = {}

    def by_id(self, map_id: str) -> PublishedMap | None:
        return self._by_id.get(map_id)

    def by_digest(self, digest: str) -> PublishedMap | None:
        return self._by_digest.get(digest)

    async def encoded(self, published: PublishedMap, coding: Coding) -> bytes:
        """`published.body` in `coding`; concurrent first requests share one compression."""
        key = (published.digest, coding)
        task = self._encoded.get(key)
        if task is None:
            task = asyncio.create_task(asyncio.to_thread(COMPRESSORS[coding], published.body))
            self._encoded[key] = task
        return await asyncio.shield(task)


MAPS = web.AppKey("maps", MapStore)
# The configured public origin (`public_url`) for index URLs; absent: each request's Host.
PUBLIC_ORIGIN = web.AppKey("public_origin", str)


def _not_found(request: web.Request) -> web.Response:
    response = json_error(
        404,
        f"no Codec document at {quoted(request.raw_path.partition('?')[0])}",
        error_type="not_found_error",
        code="not_found",
    )
    response.headers.update([CORS_ALLOW_ORIGIN])
    return response


def _accept_encoding(request: web.Request) -> str | None:
    return combined_header(request, "Accept-Encoding")


def _document(body: bytes, cache_control: str, etag: str | None = None) -> web.Response:
    headers = dict([CORS_ALLOW_ORIGIN, ("Cache-Control", cache_control)])
    if etag is not None:
        headers["ETag"] = entity_tag(etag)
    return web.Response(body=body, content_type="application/json", headers=headers)


def _reply(
    request: web.Request, body: bytes, digest: str, cache_control: str, coded: bytes | None
) -> web.Response:
    """200 with `coded` (if the client takes a coding) or `body`, or 304; same headers."""
    coding = choose_coding(_accept_encoding(request)) if coded is not None else None
    headers = reply_headers(digest, cache_control, coding)
    if if_none_match(request.headers.get("If-None-Match"), entity_tag(digest)):
        return web.Response(status=304, headers=headers)
    return web.Response(body=coded if coded is not None else body, headers=headers)


async def _map_reply(
    request: web.Request, published: PublishedMap, cache_control: str
) -> web.Response:
    coding = choose_coding(_accept_encoding(request))
    coded = None if coding is None else await request.app[MAPS].encoded(published, coding)
    return _reply(request, published.body, published.digest, cache_control, coded)


def _origin(request: web.Request) -> tuple[str | None, str]:
    """The origin absolute URLs start with, and the Cache-Control that goes with it.

    codecai wants absolute URLs (interop.md §1.6): from the configured public origin, else from
    this request's Host, and then good for that Host only (None: a Host we will not echo).
    """
    origin = request.app.get(PUBLIC_ORIGIN)
    if origin is not None:
        return origin, SHORT_CACHE_CONTROL
    return origin_of(request.scheme, request.host), HOST_DERIVED_CACHE_CONTROL


def _small_reply(request: web.Request, body: bytes, cache_control: str) -> web.Response:
    """A document of a few hundred bytes, naming an origin: compressed inline, not kept."""
    coding = choose_coding(_accept_encoding(request))
    coded = None if coding is None else COMPRESSORS[coding](body)
    digest = hashlib.sha256(body).hexdigest()
    response = _reply(request, body, digest, cache_control, coded)
    if cache_control is HOST_DERIVED_CACHE_CONTROL:
        response.headers["Vary"] = "Accept-Encoding, Host"
    return response


def _index_entries(request: web.Request) -> list[IndexEntry]:
    """One entry per map, naming every model served with it and their dictionaries."""
    entries: dict[str, IndexEntry] = {}
    for model in request.app[SERVED_MODELS]:
        if model.speaks_codec:
            continue  # its map is the upstream's, listed in the upstream's index
        published = model.published
        entry = entries.get(published.digest, IndexEntry(published))
        dictionaries = tuple((r.format, r.hash.removeprefix("sha256:"))
                             for r in model.dictionaries.records)  # fmt: skip
        entries[published.digest] = IndexEntry(
            published,
            entry.models + model.config.names,
            tuple(dict.fromkeys(entry.dictionaries + dictionaries)),
        )
    return list(entries.values())


def _index_reply(request: web.Request) -> web.Response:
    origin, cache_control = _origin(request)
    if origin is None:
        return _not_found(request)
    entries = _index_entries(request)
    if request.app[SERVED_MODELS].listed_names is None:
        # One model serving any name: no name to list (`default` is no name a client sends).
        entries = [dataclasses.replace(entry, models=()) for entry in entries]
    return _small_reply(request, index_body(origin, entries), cache_control)


async def version_policy(request: web.Request) -> web.Response:
    """404 unless something is enforced (WKD: SHOULD NOT publish otherwise)."""
    document = config_of(request).version_policy.document()
    if document is None:
        return _not_found(request)
    return _document(document, _VERSION_POLICY_CACHE)


async def safety_policy(request: web.Request) -> web.Response:
    """`policies/<id>.json` and `policies/sha256/<hex>.json`: the same canonical bytes.

    Only the exact paths of the loaded policy are served; nothing touches the filesystem, so
    no path can reach anything else.
    """
    policy = next(iter(config_of(request).safety_policies.values()), None)
    if policy is not None:
        if request.path == policy.id_path:
            return _document(policy.canonical, SHORT_CACHE_CONTROL, policy.sha256)
        if request.path == policy.hash_path:
            return _document(policy.canonical, IMMUTABLE_CACHE_CONTROL, policy.sha256)
    return _not_found(request)


async def dictionary(request: web.Request) -> web.Response:
    """`dicts/<64-hex>.zstd`: the raw dictionary bytes, content-addressed."""
    name = request.match_info["name"]
    hex_digest = name.removesuffix(".zstd")
    found = None
    if name.endswith(".zstd") and is_sha256_hex(hex_digest):
        found = request.app[SERVED_MODELS].dictionary(hex_digest)
    if found is None:
        return _not_found(request)
    return web.Response(
        body=found,
        content_type="application/octet-stream",
        headers=dict([CORS_ALLOW_ORIGIN, ("Cache-Control", IMMUTABLE_CACHE_CONTROL)]),
    )


async def maps(request: web.Request) -> web.StreamResponse:
    """`index.json`, `maps/<id>.json` and `maps/sha256/<hex>.json`; any other path, a 404."""
    store = request.app[MAPS]
    target = discovery_target(request.raw_path)
    if isinstance(target, IndexDocument):
        return _index_reply(request)
    if isinstance(target, MapById) and (published := store.by_id(target.map_id)) is not None:
        if not is_pointed_to(published):
            return await _map_reply(request, published, SHORT_CACHE_CONTROL)
        origin, cache_control = _origin(request)
        if origin is None:
            return _not_found(request)
        return _small_reply(request, pointer_body(origin, published), cache_control)
    if isinstance(target, MapInline) and (published := store.by_id(target.map_id)) is not None:
        return await _map_reply(request, published, SHORT_CACHE_CONTROL)
    if isinstance(target, MapByDigest) and (
        (published := store.by_digest(target.digest)) is not None
        # A Codec upstream's map, verified: the answers relayed to Codec clients name it.
        or (published := request.app[SERVED_MODELS].pinned_map(target.digest)) is not None
    ):
        return await _map_reply(request, published, IMMUTABLE_CACHE_CONTROL)
    return _not_found(request)


async def preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers=PREFLIGHT_HEADERS)


async def not_allowed(request: web.Request) -> web.Response:
    return method_not_allowed(
        request.method, "Codec documents", ALLOWED_METHODS, headers=[CORS_ALLOW_ORIGIN]
    )


def routes() -> list[web.RouteDef]:
    """GET (and HEAD) per document, OPTIONS everywhere, 405 for any other method."""
    prefix = WELL_KNOWN_PREFIX.rstrip("/")
    return [
        web.get(VERSION_POLICY_PATH, version_policy),
        web.get(WELL_KNOWN_POLICIES + "/{name:.+}", safety_policy),
        web.get(prefix + "/dicts/{name}", dictionary),
        web.get(prefix + "{tail:(/.*)?}", maps),
        web.options(prefix + "{tail:(/.*)?}", preflight),
        web.route("*", prefix + "{tail:(/.*)?}", not_allowed),
    ]
