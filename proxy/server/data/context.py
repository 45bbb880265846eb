"""What the control plane hands the data plane for one request, and the tracked exchange."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from proxy.server.data.drain import Lifecycle
from proxy.server.data.exchange import Exchange
from proxy.server.data.upstreams import UpstreamPool
from proxy.server.telemetry.metrics import Metrics
from proxy.server.telemetry.record import RequestRecord
from proxy.server.telemetry.request_trace import RequestTrace


@dataclass(frozen=True, slots=True)
class StreamContext:
    """What the control plane decided for one request's upstream exchange and stream: the
    data plane looks nothing up on the request or in the reloadable configuration."""

    record: RequestRecord
    metrics: Metrics
    lifecycle: Lifecycle
    mode: str  # codec | passthrough | policed
    model: str  # the metric label
    write_timeout: float  # seconds; 0: none
    # The request's trace when traces are exported: each upstream attempt is a span of it.
    trace: RequestTrace | None = None


@contextlib.asynccontextmanager
async def tracked_exchange(
    context: StreamContext,
    pool: UpstreamPool,
    *,
    method: str,
    path_qs: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
) -> AsyncIterator[Exchange]:
    """The upstream request of one client request, tracked and accounted; yields once the
    upstream's response head is in. The request record, the active-streams gauge and the
    drain's count of streams in flight follow it."""
    record = context.record
    record.mode = context.mode
    record.phase = "upstream_headers"
    metrics = context.metrics
    active = metrics.active_streams.labels(context.mode, context.model)
    active.inc()
    try:
        with context.lifecycle.tracking():
            async with pool.open(
                method, path_qs, headers=headers, data=body, trace=context.trace
            ) as exchange:
                record.upstream = exchange.upstream.url
                try:
                    yield exchange
                finally:
                    # Also when the client hangs up mid-stream.
                    record.bytes_in = exchange.bytes_in
                    metrics.bytes_in.labels(context.mode, context.model).inc(exchange.bytes_in)
    finally:
        active.dec()
