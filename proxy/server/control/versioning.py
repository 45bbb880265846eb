"""Codec version negotiation at the edge: the client's version, the 426 gate, header floors.

* `client_version(request)`: the request's `Codec-Client-Version` (absent: 0.2; unparsable:
  0.0, logged once per client address), parsed once per request and kept on it;
  `declared_client_version(request)` is the same parse, None when the header was absent.
* `codec_gate(request)`: call it on every Codec entry point before contacting the upstream; it
  raises the 426 when this deployment enforces a floor the client is below.
* `announce_server_version`: `Codec-Server-Version` on the responses to Codec requests, as a
  response is prepared (the edge's hook, server/control/edge.py), before the next one.
* `strip_withheld_headers`: the one place the header floor table is applied, as every response
  is prepared, so it covers every response whichever handler built it (Codec streams, relayed
  upstream responses, errors, well-known documents).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from aiohttp import web

from proxy.core.http.versioning import (
    CLIENT_VERSION_HEADER,
    SERVER_VERSION,
    SERVER_VERSION_HEADER,
    ClientVersion,
    ParsedClientVersion,
    parse_client_version,
    version_label,
    withheld_headers,
)
from proxy.core.shown import quoted
from proxy.server.models.live import config_of
from proxy.server.telemetry.record import RECORD

log = logging.getLogger("codec_proxy")

# Client addresses remembered for "log once"; the oldest are forgotten beyond this, so a scan
# from many addresses costs bounded memory (and at worst repeats a log line).
_REMEMBERED_ADDRESSES = 4096


class VersionNotices:
    """Remembers which client addresses were already logged about, per kind of notice."""

    def __init__(self, capacity: int = _REMEMBERED_ADDRESSES) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first_time(self, kind: str, address: str) -> bool:
        key = (kind, address)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True


VERSION_NOTICES = web.AppKey("version_notices", VersionNotices)
CLIENT_VERSION = web.RequestKey("client_version", ParsedClientVersion)


def _parsed_client_version(request: web.Request) -> ParsedClientVersion:
    """`Codec-Client-Version`, parsed on first use, then kept on the request."""
    if CLIENT_VERSION in request:
        return request[CLIENT_VERSION]
    header = request.headers.get(CLIENT_VERSION_HEADER)
    parsed = parse_client_version(header)
    address = request.remote or "unknown"
    if parsed.unparsable and request.app[VERSION_NOTICES].first_time("unparsable", address):
        log.warning(
            "unparsable %s %s from %s: treated as %s (logged once per address)",
            CLIENT_VERSION_HEADER,
            quoted(header or ""),
            address,
            parsed.version,
        )
    request[CLIENT_VERSION] = parsed
    record = request.get(RECORD)
    if record is not None and header is not None:
        record.client_version = str(parsed.version)
    return parsed


def client_version(request: web.Request) -> ClientVersion:
    """The Codec version this request is treated as (absent: 0.2)."""
    return _parsed_client_version(request).version


def declared_client_version(request: web.Request) -> ClientVersion | None:
    """The Codec version the client declared; None when it sent no `Codec-Client-Version`."""
    return _parsed_client_version(request).declared


def client_version_label(request: web.Request) -> str:
    """The request's client version as a bounded metric label."""
    return version_label(_parsed_client_version(request))


def codec_gate(request: web.Request) -> ClientVersion:
    """The client's version, or the 426 when this deployment enforces a higher one.

    Must run before any upstream contact on every Codec entry point (codec-spec.md §12 item
    24). JSON requests are not Codec traffic and never go through it.
    """
    client = client_version(request)
    policy = config_of(request).version_policy
    if policy.refuses(client):
        raise policy.upgrade_required(client)
    address = request.remote or "unknown"
    if policy.advises(client) and request.app[VERSION_NOTICES].first_time("advisory", address):
        log.info(
            "Codec client %s at version %s is below 0.4 (advisory version policy: served)",
            address,
            client,
        )
    return client


def announce_server_version(request: web.Request, response: web.StreamResponse) -> None:
    """`Codec-Server-Version` on every response to a Codec request (the access log's
    `mode=codec`: a stream, or its refusal once the request is known to be one),
    the I-D's "Codec responses"; on no other. An upstream's own is dropped from what is relayed
    for JSON: the proxy, not the backend, is the Codec server its clients talk to, and
    `/codec/version` says what it serves. Documents carry none (their bodies are shared by
    clients of every version; `/codec/version` says it in its body). The floor hook after this
    one withholds it from clients below 0.5 (docs/VERSIONING_AND_SAFETY.md)."""
    record = request.get(RECORD)
    if record is not None and record.mode == "codec":
        response.headers[SERVER_VERSION_HEADER] = str(SERVER_VERSION)
    else:
        response.headers.popall(SERVER_VERSION_HEADER, None)


def strip_withheld_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Drop every `Codec-*` header above the client's version."""
    client = client_version(request)
    for name in withheld_headers(client, set(response.headers.keys())):
        response.headers.popall(name, None)
