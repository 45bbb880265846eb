"""`GET /readyz`: 200 when every readiness check passes, else 503 with the reasons. Answered by
the proxy itself, never relayed (the backend's own `/health` still is)."""

from __future__ import annotations

from aiohttp import web

from proxy.server.errors import json_error
from proxy.server.keys import READINESS


async def readyz(request: web.Request) -> web.Response:
    readiness = request.app[READINESS]
    return web.json_response(
        readiness.report(),
        status=200 if readiness.ready else 503,
        headers={"Cache-Control": "no-store"},
    )


async def method_not_allowed(request: web.Request) -> web.Response:
    """Any other method on a path the proxy answers itself, so it is not relayed upstream."""
    response = json_error(
        405,
        f"{request.method} is not allowed on {request.path}",
        error_type="invalid_request_error",
        code="method_not_allowed",
    )
    response.headers["Allow"] = "GET, HEAD"
    return response
