"""The control plane's hand-over to the data plane: who the stream is for, and its upstream."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from aiohttp import web

from proxy.server.data.context import StreamContext, tracked_exchange
from proxy.server.data.drain import LIFECYCLE
from proxy.server.data.exchange import Exchange
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


def upstream_exchange(
    request: web.Request,
    context: StreamContext,
    *,
    method: str,
    path_qs: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
) -> contextlib.AbstractAsyncContextManager[Exchange]:
    """The request to the routed model's upstreams; yields once the response head is in."""
    return tracked_exchange(
        context, model_of(request).pool, method=method, path_qs=path_qs, headers=headers, body=body
    )
