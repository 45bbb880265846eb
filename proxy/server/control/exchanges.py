"""The control plane's hand-over to the data plane: who the stream is for. Its exchange is
opened on the routed model's pool (`model_of(request).pool.open(context, ...)`)."""

from __future__ import annotations

from aiohttp import web

from proxy.server.data.context import StreamContext
from proxy.server.data.drain import LIFECYCLE
from proxy.server.models.live import config_of
from proxy.server.models.served_models import model_of
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD
from proxy.server.telemetry.request_trace import TRACE


def stream_context(request: web.Request, mode: str) -> StreamContext:
    """Everything the data plane needs to know about this request's stream, decided once:
    the request's configuration snapshot and its model (the default until routed)."""
    app = request.app
    return StreamContext(
        record=request[RECORD],
        metrics=app[METRICS],
        lifecycle=app[LIFECYCLE],
        mode=mode,
        model=model_of(request).name,
        write_timeout=config_of(request).settings.write_timeout,
        trace=request.get(TRACE),
    )
