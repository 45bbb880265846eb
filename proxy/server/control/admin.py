"""The admin listener (`admin_port`): the proxy's own `/livez`, `/readyz` and `/metrics` on a
port of their own, so the serving port can relay those paths to the backend.

An endpoint picker (Gateway API Inference Extension, llm-d) scrapes a pod's model-server
metrics at the port it routes to; with the proxy as the sidecar on that port, the picker must
get the engine's metrics there, not the proxy's (docs/DEPLOY.md, "Behind an endpoint picker").

The admin app answers for the same process as the serving app: it shares its readiness, its
lifecycle, its models, its metrics (every worker's, with `--workers N`) and its configuration.
It has no key check: probes and scrapers carry none, as on the serving port without an admin
port. The runner starts it after the serving port listens and closes it last, so it answers
probes through the whole drain (`/readyz` 503) until the process exits.
"""

from __future__ import annotations

from aiohttp import web

from proxy.server.control import local
from proxy.server.control.edge import admin_response_headers, edge_middleware
from proxy.server.control.expect import with_expect_handler
from proxy.server.data.drain import LIFECYCLE, READINESS
from proxy.server.models.live import LIVE
from proxy.server.models.served_models import SERVED_MODELS
from proxy.server.telemetry.metrics import METRICS

# The admin app of a serving app that has one (created with it, served by the runner).
ADMIN_APP = web.AppKey("admin_app", web.Application)


def admin_app(app: web.Application) -> web.Application:
    """The admin app for `app`, on `app`'s state. Any other path is the JSON 404."""
    admin = web.Application(middlewares=[edge_middleware(None)])
    admin[LIVE] = app[LIVE]
    admin[METRICS] = app[METRICS]
    admin[LIFECYCLE] = app[LIFECYCLE]
    admin[READINESS] = app[READINESS]
    admin[SERVED_MODELS] = app[SERVED_MODELS]
    admin.on_response_prepare.append(admin_response_headers)
    admin.add_routes(with_expect_handler(local.probe_routes()))
    return admin
