"""The proxy's own routes, answered here and never relayed upstream (every method: the ones
they do not take get a JSON 405).

* The probes and metrics, `/livez`, `/readyz`, `/metrics`: on the admin listener when
  `admin_port` is set (proxy/server/control/admin.py; the serving port then relays these paths
  to the backend like any other), on the serving port otherwise.
* The Codec documents, `/codec/schema` and `/codec/version`: always on the serving port, where
  clients are. Public like the discovery documents, with their rules (well_known.py): no key,
  any origin, an OPTIONS preflight answered, other methods a 405.
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.core.http.server_version import Capabilities, capabilities, version_document
from proxy.core.maps.discovery import CORS_ALLOW_ORIGIN
from proxy.server.control import well_known
from proxy.server.control.errors import method_not_allowed
from proxy.server.data.drain import LIFECYCLE, READINESS
from proxy.server.models.live import config_of
from proxy.server.models.served_models import SERVED_MODELS
from proxy.server.telemetry.metrics import METRICS

# What `GET /codec/schema` serves: the proto3 schema of exactly what is emitted.
SCHEMA_TEXT = web.AppKey("schema_text", str)
# Asked every few seconds by orchestrators and Prometheus: never traced (control/observe.py),
# answered here or relayed to the backend's.
PROBE_PATHS = ("/livez", "/readyz", "/metrics")
DOCUMENT_PATHS = ("/codec/schema", "/codec/version")
LOCAL_PATHS = (*PROBE_PATHS, *DOCUMENT_PATHS)


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
    return web.Response(
        text=request.app[SCHEMA_TEXT], content_type="text/plain", headers=[CORS_ALLOW_ORIGIN]
    )


async def version(request: web.Request) -> web.Response:
    """`GET /codec/version` (codec-spec.md §3.6): as the request's configuration serves Codec
    now. A reload may switch Codec off, so caches revalidate."""
    live = config_of(request)
    served = request.app[SERVED_MODELS]

    def of(name: str) -> Capabilities:
        refusal = live.access.refusal_for_all(
            model=name, model_enabled=live.model(name).codec_enabled
        )
        return capabilities(codec_served=refusal is None)

    by_model = {model.name: of(model.name) for model in served}
    names = served.listed_names or ()
    by_name = {name: by_model[served.route(name).name] for name in names}
    body = version_document(by_model[served.default.name], by_name)
    return web.Response(
        body=body,
        content_type="application/json",
        headers=[CORS_ALLOW_ORIGIN, ("Cache-Control", "no-cache")],
    )


async def not_allowed(request: web.Request) -> web.Response:
    return method_not_allowed(request.method, request.path, "GET, HEAD")


def probe_routes() -> list[web.RouteDef]:
    handlers = dict(zip(PROBE_PATHS, (livez, readyz, metrics), strict=True))
    return [
        *(web.get(path, handler) for path, handler in handlers.items()),
        *(web.route("*", path, not_allowed) for path in PROBE_PATHS),
    ]


def document_routes() -> list[web.RouteDef]:
    handlers = dict(zip(DOCUMENT_PATHS, (schema, version), strict=True))
    return [
        *(web.get(path, handler) for path, handler in handlers.items()),
        *(web.options(path, well_known.preflight) for path in DOCUMENT_PATHS),
        *(web.route("*", path, well_known.not_allowed) for path in DOCUMENT_PATHS),
    ]


def routes(*, probes: bool = True) -> list[web.RouteDef]:
    """The serving port's local routes; `probes=False` when the admin listener has those."""
    return [*(probe_routes() if probes else ()), *document_routes()]
