"""`/livez` and `/metrics`: answered by the proxy itself, never relayed upstream.

(`/readyz` is in `readiness.py`: it reports every readiness check.)
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.server.keys import LIFECYCLE, METRICS


async def livez(request: web.Request) -> web.Response:
    """The process runs and its event loop answers."""
    uptime = time.monotonic() - request.app[LIFECYCLE].started
    return web.json_response({"status": "alive", "uptime_seconds": round(uptime, 3)})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
