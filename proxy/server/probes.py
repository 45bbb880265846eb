"""`/livez`, `/readyz` and `/metrics`: answered by the proxy itself, never relayed upstream."""

from __future__ import annotations

import json
import time

from aiohttp import web

from proxy.server.keys import LIFECYCLE, METRICS


async def livez(request: web.Request) -> web.Response:
    """The process runs and its event loop answers."""
    uptime = time.monotonic() - request.app[LIFECYCLE].started
    return web.json_response({"status": "alive", "uptime_seconds": round(uptime, 3)})


async def readyz(request: web.Request) -> web.Response:
    """Ready for traffic: not draining, an upstream available, every registered check passing."""
    problems = request.app[LIFECYCLE].problems()
    body = {"ready": not problems, "problems": problems}
    return web.Response(
        status=503 if problems else 200,
        body=json.dumps(body).encode(),
        content_type="application/json",
    )


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
