"""Compressed JSON responses (`json_compression`): the decision for one response, and its body.

The rules are the core's (proxy/core/http/json_coding.py: which responses, which headers;
content_coding.py: which coding); this module reads them for a request: its configuration
snapshot, its model's flush schedule, its `Accept-Encoding`, the upstream's response head.
The relay (relay.py) and the safety policy's JSON path (policed_json.py) both ask it, so a
JSON response is compressed the same way whichever of them serves it, and under every rollout
switch (those decide who gets Codec; JSON is never refused by them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from proxy.core.bodies import CompressedEventsBody, CompressedWholeBody, RelayedBody, ResponseBody
from proxy.core.compression.compressors import plain_compressor
from proxy.core.compression.event_writer import EventWriter
from proxy.core.compression.flush import FlushConfig
from proxy.core.http.content_coding import (
    IDENTITY,
    MEASURED_CURVE,
    ContentCoding,
    negotiate_json_coding,
)
from proxy.core.http.json_coding import JsonBody, coded_headers, compressible_json
from proxy.server.control.auth import presented_key
from proxy.server.control.headers import combined_header
from proxy.server.data.upstream_protocol import ResponseHead
from proxy.server.models.live import config_of
from proxy.server.models.served_models import model_of

# A body compressed whole is held until its end, for its Content-Length; past this many
# compressed bytes (several MiB of JSON) it is sent on as it comes, without a length.
WHOLE_BODY_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class JsonCompression:
    """How one compressible JSON response is sent: `coding` (identity: only `Vary` changes),
    as an event stream or a whole body."""

    body_kind: JsonBody
    coding: ContentCoding
    flush: FlushConfig
    max_event_bytes: int

    @property
    def coded(self) -> bool:
        return self.coding != IDENTITY

    def headers(self, upstream: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return coded_headers(upstream, self.coding)

    def body(self, inner: RelayedBody) -> ResponseBody:
        """`inner` (what identity would send), compressed; `inner` itself for identity."""
        if not self.coded:
            return inner
        compressor = plain_compressor(self.coding)
        if self.body_kind == "events":
            writer = EventWriter(compressor, self.flush)
            return CompressedEventsBody(inner, writer, max_held=self.max_event_bytes)
        return CompressedWholeBody(compressor, max_buffered=WHOLE_BODY_BYTES)

    def whole(self, data: bytes) -> bytes:
        """`data`, a whole body already in hand, in this coding."""
        compressor = plain_compressor(self.coding)
        return compressor.feed(data) + compressor.flush()


def json_compression(request: web.Request, upstream: ResponseHead) -> JsonCompression | None:
    """How the upstream's response is sent to this client; None: as it came, untouched (the
    setting is off, the response is not one the proxy compresses, or its model's or API key's
    responses go uncompressed)."""
    live = config_of(request)
    if live.settings.json_compression != "on":
        return None
    name = model_of(request).name
    if live.uncompressed(name, presented_key(request)):
        return None
    fields = upstream.headers
    body_kind = compressible_json(
        status=upstream.status,
        content_type=fields.get("Content-Type"),
        content_encoding=_joined(fields.getall("Content-Encoding", [])),
        cache_control=_joined(fields.getall("Cache-Control", [])),
        request_cache_control=combined_header(request, "Cache-Control"),
    )
    if body_kind is None:
        return None
    model = live.model(name)
    flush = FlushConfig(model.flush_interval_ms, model.flush_frames)
    # A stream is flushed on the schedule; a whole body is one window, as wide as it gets.
    window = (
        MEASURED_CURVE.window_ms(flush.interval_ms, flush.max_frames)
        if body_kind == "events"
        else float("inf")
    )
    coding = negotiate_json_coding(combined_header(request, "Accept-Encoding"), window_ms=window)
    return JsonCompression(body_kind, coding, flush, live.settings.max_event_bytes)


def _joined(values: list[str]) -> str | None:
    return ", ".join(values) if values else None
