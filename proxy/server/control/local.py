"""The proxy's own routes, answered here and never relayed upstream: `/livez`, `/readyz`,
`/metrics` and `/codec/schema` (every method: the ones they do not take get a JSON 405)."""

from __future__ import annotations

import time

from aiohttp import web

from proxy.server.control.errors import method_not_allowed
from proxy.server.data.drain import LIFECYCLE, READINESS
from proxy.server.models.served_models import SERVED_MODELS
from proxy.server.telemetry.metrics import METRICS

# What `GET /codec/schema` serves: the proto3 schema of exactly what is emitted.
SCHEMA_TEXT = web.AppKey("schema_text", str)
# Asked every few seconds by orchestrators and Prometheus: never traced (control/observe.py).
PROBE_PATHS = ("/livez", "/readyz", "/metrics")
LOCAL_PATHS = (*PROBE_PATHS, "/codec/schema")


async def livez(request: web.Request) -> web.Response:
    """The process runs and its event loop answers."""
    uptime = time.monotonic() - request.app[LIFECYCLE].started
    return web.json_response({"status": "alive", "uptime_seconds": round(uptime, 3)})


async def readyz(request: web.Request) -> web.Response:
    """200 when every readiness check passes, else 503 with the reasons."""
    readiness = request.app[READINESS]
    served = request.app[SERVED_MODELS]
    return web.json_response(
        served.report(readiness),
        status=200 if readiness.ready and served.ready() else 503,
        headers={"Cache-Control": "no-store"},
    )


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


async def schema(request: web.Request) -> web.Response:
    """`GET /codec/schema` (codec-spec.md §3.4)."""
    return web.Response(text=request.app[SCHEMA_TEXT], content_type="text/plain")


async def not_allowed(request: web.Request) -> web.Response:
    return method_not_allowed(request.method, request.path, "GET, HEAD")


def routes() -> list[web.RouteDef]:
    handlers = dict(zip(LOCAL_PATHS, (livez, readyz, metrics, schema), strict=True))
    return [
        *(web.get(path, handler) for path, handler in handlers.items()),
        *(web.route("*", path, not_allowed) for path in LOCAL_PATHS),
    ]
