"""An OTLP/HTTP trace receiver in the test process: what a collector would get from the proxy.

`POST /v1/traces` takes an `ExportTraceServiceRequest` (protobuf, gzip or not), decoded with the
official `opentelemetry-proto` classes, and keeps every span as a plain `ReceivedSpan`.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str  # server, client, internal, ...
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    start: int  # Unix nanoseconds
    end: int
    attributes: dict[str, Any]
    status: str  # unset, ok, error
    resource: dict[str, Any]
    trace_state: str
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each linked span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def _suffix(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    exports: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        return app

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert request.headers["Content-Type"] == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=_suffix(Span.SpanKind.Name(span.kind), "SPAN_KIND_"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            status=_suffix(
                                Status.StatusCode.Name(span.status.code), "STATUS_CODE_"
                            ),
                            resource=resource,
                            trace_state=span.trace_state,
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                        )
                    )
        self.exports += 1
        self._arrived.set()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def wait_for(self, count: int, seconds: float = 10.0) -> list[ReceivedSpan]:
        """The spans received, once there are at least `count` of them."""
        async with asyncio.timeout(seconds):
            while len(self.spans) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return list(self.spans)


def render_trace(spans: list[ReceivedSpan]) -> str:
    """Spans as a tree, each with its kind, times relative to the root and attributes."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {span.span_id for span in spans}
    for span in sorted(spans, key=lambda s: s.start):
        parent = span.parent_id if span.parent_id in ids else ""
        by_parent.setdefault(parent, []).append(span)
    roots = by_parent.get("", [])
    origin = min((span.start for span in spans), default=0)
    lines: list[str] = []

    def show(span: ReceivedSpan, depth: int) -> None:
        pad = "  " * depth
        start_ms = (span.start - origin) / 1e6
        lines.append(
            f"{pad}{span.kind.upper()} {span.name!r}  trace {span.trace_id}  span {span.span_id}"
            f"  parent {span.parent_id or '-'}  +{start_ms:.1f} ms, "
            f"{(span.end - span.start) / 1e6:.1f} ms  status {span.status}"
        )
        for key in sorted(span.attributes):
            lines.append(f"{pad}    {key} = {span.attributes[key]!r}")
        for child in by_parent.get(span.span_id, []):
            show(child, depth + 1)

    if spans:
        lines.append(f"resource: {spans[0].resource}")
    for root in roots:
        show(root, 0)
    return "\n".join(lines)
