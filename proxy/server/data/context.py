"""What the control plane hands the data plane for one request."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.server.data.drain import Lifecycle
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
