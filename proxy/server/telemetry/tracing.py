"""OpenTelemetry traces: whether they are on, and a worker's tracer while its app runs.

Off unless an OTLP endpoint is given: `otlp_traces_endpoint` (flag, `CODEC_PROXY_*` variable,
file key), else the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT`. Everything else (headers, timeout, compression, TLS files, the
sampler, service name and resource attributes) comes from the standard `OTEL_*` variables, read
by the OpenTelemetry SDK itself. Off, nothing of OpenTelemetry is imported: the spans are made in
`otel.py`, which a worker imports when it starts with tracing on, and a request pays one lookup.

A request that is traced has a `RequestTrace` (traces.py): one server span, from the request head
to the end of its response body (the handler returns only once the stream's last bytes are
written), whose parent is the caller's `traceparent`; and one client span per upstream attempt
(a retry before the first byte is another), whose context goes upstream as `traceparent` in
place of the caller's, so that the backend's spans nest under it. The data plane only opens an
attempt per upstream request and ends it with its exchange: nothing per relayed chunk.

No prompt, completion or tool-call text is ever put in a span, nor any header value but the
trace context.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from aiohttp import web

from proxy.core.errors import ConfigError
from proxy.core.shown import without_credentials
from proxy.server.telemetry.traces import RequestTrace

if TYPE_CHECKING:
    from proxy.server.telemetry.otel import OtelTracer

# Where OTLP/HTTP receivers take traces, below a collector's base URL (the OTLP specification).
TRACES_PATH: Final = "/v1/traces"
# The only exporter protocol shipped: the gRPC one needs grpcio, a large native dependency.
_PROTOCOL = "http/protobuf"


@dataclass(frozen=True)
class TracingConfig:
    endpoint: str  # the OTLP/HTTP traces URL


def tracing_config(
    configured: str | None, environ: Mapping[str, str] = os.environ
) -> TracingConfig | None:
    """Whether traces are exported, and where (None: off). `ConfigError` for what the SDK
    would only log and ignore: an exporter or protocol this proxy does not ship."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if configured:
        endpoint = configured
        # A collector's base URL, as most people write it, is not where it takes traces.
        if urlsplit(configured).path in ("", "/"):
            endpoint = configured.rstrip("/") + TRACES_PATH
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        endpoint = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH
    else:
        return None
    if exporter != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: only 'otlp' or 'none' is supported")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or _PROTOCOL
    ).strip()
    if protocol != _PROTOCOL:
        raise ConfigError(
            f"OTLP protocol {protocol!r}: traces are exported over OTLP/HTTP only "
            f"({_PROTOCOL}; a collector takes it on port 4318)"
        )
    if not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"OTLP traces endpoint {without_credentials(repr(endpoint))}: not an http(s) URL"
        )
    return TracingConfig(endpoint)


class Tracing:
    """One worker's tracing, while its app runs: the SDK's provider and exporter are made
    when the app starts (`context`, a cleanup context) and flushed and shut down when it
    stops, so each of `--workers N` exports its own spans."""

    def __init__(self, config: TracingConfig) -> None:
        self.config = config
        self._tracer: OtelTracer | None = None

    def begin(self, request: web.Request, route: str) -> RequestTrace | None:
        """The trace of a request just arrived; None outside the app's run."""
        tracer = self._tracer
        return None if tracer is None else tracer.begin(request, route)

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        from proxy.server.telemetry.otel import OtelTracer

        tracer = self._tracer = OtelTracer(self.config.endpoint)
        try:
            yield
        finally:
            self._tracer = None
            # Exporting what is left may wait on the collector: not on the loop.
            await asyncio.to_thread(tracer.shutdown)


TRACING = web.AppKey[Tracing]("tracing")
