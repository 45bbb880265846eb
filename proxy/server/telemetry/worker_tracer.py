"""A worker's tracer while its app runs, when traces are exported.

Off unless an OTLP endpoint is given (proxy/trace_endpoint.py says where from). Everything else
(headers, timeout, compression, TLS files, the sampler, service name and resource attributes)
comes from the standard `OTEL_*` variables, read by the OpenTelemetry SDK itself. Off, nothing of
OpenTelemetry is imported: the spans are made in `otel_spans.py`, which a worker imports when it
starts with tracing on, and a request pays one lookup.

A request that is traced has a `RequestTrace` (request_trace.py): one server span, from the
request head to the end of its response body (the handler returns only once the stream's last
bytes are written), whose parent is the caller's `traceparent` (with `trust_trace_context` off,
a new trace's root, linked to the caller's span); and one client span per upstream attempt (a
retry before the first byte is another), whose context goes upstream as `traceparent` in place
of the caller's, so that the backend's spans nest under it. The data plane only opens an
attempt per upstream request and ends it with its exchange: nothing per relayed chunk.

No prompt, completion or tool-call text is ever put in a span, nor any header value but the
trace context.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from proxy.server.telemetry.request_trace import RequestTrace
from proxy.trace_endpoint import TraceEndpoint

if TYPE_CHECKING:
    from proxy.server.telemetry.otel_spans import OtelTracer


class WorkerTracer:
    """One worker's tracing, while its app runs: the SDK's provider and exporter are made
    when the app starts (`context`, a cleanup context) and flushed and shut down when it
    stops, so each of `--workers N` exports its own spans."""

    def __init__(self, endpoint: TraceEndpoint, *, trust_callers: bool) -> None:
        self.endpoint = endpoint
        self.trust_callers = trust_callers
        self._tracer: OtelTracer | None = None

    def begin(self, request: web.Request, route: str) -> RequestTrace | None:
        """The trace of a request just arrived; None outside the app's run."""
        tracer = self._tracer
        return None if tracer is None else tracer.begin(request, route)

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        from proxy.server.telemetry.otel_spans import OtelTracer

        tracer = self._tracer = OtelTracer(self.endpoint.url, trust_callers=self.trust_callers)
        try:
            yield
        finally:
            self._tracer = None
            # Exporting what is left may wait on the collector: not on the loop.
            await asyncio.to_thread(tracer.shutdown)


WORKER_TRACER = web.AppKey[WorkerTracer]("tracing")
