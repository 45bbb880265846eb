"""The access log and the request counters: one line and one count per request.

The access log is one line per request (JSON by default): ids (the proxy's own and the client's
`X-Request-Id`), route, mode, model, stream_format, encoding, client version, status, tokens,
bytes, time to first byte, duration and outcome (the fields of `RequestRecord`,
proxy/server/telemetry/record.py), and the trace id when traces are exported.

With traces on (proxy/server/telemetry/tracing.py), every request of the serving port but the
probes and scrapes has its server span from here: begun before the handler, ended once the
handler has returned, which a streamed response's handler does only after its last bytes are
written.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.core.backend.routing import NO_MODEL
from proxy.logs import FieldsLog
from proxy.server.control.local import PROBE_PATHS
from proxy.server.data.drain import is_shutdown
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD, RequestRecord, new_record, stream_end
from proxy.server.telemetry.traces import TRACE
from proxy.server.telemetry.tracing import TRACING

access_log = FieldsLog("codec_proxy.access")


def _route_name(request: web.Request) -> str:
    # The route's pattern, never the raw path: paths would make labels unbounded.
    info = request.match_info.route.resource
    canonical = info.canonical if info is not None else "unmatched"
    return "relay" if "{tail" in canonical else canonical


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    record = new_record(request, _route_name(request))
    request[RECORD] = record
    metrics = request.app[METRICS]
    tracing = request.app.get(TRACING)
    trace = None
    # By path: with an admin port these are relayed to the backend's, and just as frequent.
    if tracing is not None and request.path not in PROBE_PATHS:
        trace = tracing.begin(request, record.route)
        if trace is not None:
            request[TRACE] = trace
            record.trace_id = trace.trace_id
    try:
        response = await handler(request)
        record.status = response.status
        return response
    except (asyncio.CancelledError, ConnectionResetError) as exc:
        if record.completed:
            # Only the cleanup after a complete response was cut short: still a success.
            raise
        # The client left (aiohttp cancels the handler; a write fails), or the drain ended it.
        shutdown = isinstance(exc, asyncio.CancelledError) and is_shutdown(exc)
        if record.outcome == "ok":
            record.outcome = "ended_by_shutdown" if shutdown else "client_disconnect"
        if not shutdown:
            metrics.client_disconnects.labels(record.phase).inc()
        record.status = record.status or 499  # nginx's "client closed request"
        raise
    except web.HTTPException as exc:
        record.status = exc.status
        raise
    finally:
        model = record.model or NO_MODEL
        metrics.requests.labels(record.route, record.mode, str(record.status), model).inc()
        end = stream_end(record)
        if end is not None:
            metrics.streams.labels(model, record.mode, end).inc()
        if trace is not None:
            trace.end(record)
        _log(request, record)


def _log(request: web.Request, record: RequestRecord) -> None:
    if access_log.enabled:
        access_log.info("request", record.log_fields())
