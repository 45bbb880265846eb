"""The access log and the request counters: one line and one count per request.

The access log is one line per request (JSON by default): ids (the proxy's own and the client's
`X-Request-Id`), route, mode, model, stream_format, encoding, client version, status, tokens,
bytes, time to first byte, duration and outcome (the fields of `RequestRecord`,
proxy/server/telemetry/record.py), and the trace id when traces are exported.

With traces on (proxy/server/telemetry/worker_tracer.py), every request of the serving port but the
probes and scrapes has its server span from here: begun before the handler, ended once the
handler has returned, which a streamed response's handler does only after its last bytes are
written. The edge's middleware (server/control/edge.py) calls these three steps.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.core.backend.routing import NO_MODEL
from proxy.logs import FieldsLog
from proxy.server.control.local import PROBE_PATHS
from proxy.server.data.drain import is_shutdown
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD, RequestRecord, new_record, stream_end
from proxy.server.telemetry.request_trace import TRACE
from proxy.server.telemetry.worker_tracer import WORKER_TRACER

access_log = FieldsLog("codec_proxy.access")


def _route_name(request: web.Request) -> str:
    # The route's pattern, never the raw path: paths would make labels unbounded.
    info = request.match_info.route.resource
    canonical = info.canonical if info is not None else "unmatched"
    return "relay" if "{tail" in canonical else canonical


def observe_start(request: web.Request) -> RequestRecord:
    """A request arrives: its record (kept on it), and its server span when traces are on."""
    record = request[RECORD] = new_record(request, _route_name(request))
    tracer = request.app.get(WORKER_TRACER)
    # By path: with an admin port these are relayed to the backend's, and just as frequent.
    if tracer is not None and request.path not in PROBE_PATHS:
        trace = tracer.begin(request, record.route)
        if trace is not None:
            request[TRACE] = trace
            record.trace_id = trace.trace_id
    return record


def observe_failure(request: web.Request, record: RequestRecord, exc: BaseException) -> None:
    """What was raised past the JSON errors (server/control/errors.py), as the record says it."""
    if isinstance(exc, asyncio.CancelledError | ConnectionResetError):
        if record.completed:
            # Only the cleanup after a complete response was cut short: still a success.
            return
        # The client left (aiohttp cancels the handler; a write fails), or the drain ended it.
        shutdown = isinstance(exc, asyncio.CancelledError) and is_shutdown(exc)
        if record.outcome == "ok":
            record.outcome = "ended_by_shutdown" if shutdown else "client_disconnect"
        if not shutdown:
            request.app[METRICS].client_disconnects.labels(record.phase).inc()
        record.status = record.status or 499  # nginx's "client closed request"
    elif isinstance(exc, web.HTTPException):
        record.status = exc.status


def observe_end(request: web.Request, record: RequestRecord) -> None:
    """The request is over: counted, its span ended, its access-log line written."""
    metrics = request.app[METRICS]
    model = record.model or NO_MODEL
    metrics.requests.labels(record.route, record.mode, str(record.status), model).inc()
    end = stream_end(record)
    if end is not None:
        metrics.streams.labels(model, record.mode, end).inc()
    trace = request.get(TRACE)
    if trace is not None:
        trace.end(record)
    _log(request, record)


def _log(request: web.Request, record: RequestRecord) -> None:
    if access_log.enabled:
        access_log.info("request", record.log_fields())
