"""`GET /v1/models` and `GET /v1/models/{name}`, answered here from the configured models.

Clients pick a model by these names, so the list is the proxy's, not any one backend's: the
union of every configured name and alias. One model configured by `upstream` without `model`
serves any name, and its backend's own listing is relayed, as it always was.
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.core.backend.models import model_document, models_document
from proxy.server.control.relay import relay
from proxy.server.models.served_models import SERVED_MODELS, route_request

_OWNED_BY = "codec-proxy"
# `created` of every entry: when this process started serving them.
_STARTED = int(time.time())


async def list_models(request: web.Request) -> web.StreamResponse:
    """Every configured name (aliases too), in OpenAI's shape; the upstream's own listing when
    one model serves any name (`upstream` without `model`: the proxy knows no names)."""
    served = request.app[SERVED_MODELS]
    names = served.listed_names
    if names is None:
        return await _relay(request)
    body = models_document(names, created=_STARTED, owned_by=_OWNED_BY)
    return web.Response(body=body, content_type="application/json")


async def get_model(request: web.Request) -> web.StreamResponse:
    """`GET /v1/models/{name}`: the entry, or 404 `model_not_found`."""
    served = request.app[SERVED_MODELS]
    if served.listed_names is None:
        return await _relay(request)
    name = request.match_info["name"]
    # 404 model_not_found; routed (not only looked up) so that the 404 is counted and logged
    # under `unknown`, like every other request naming a model the proxy does not serve.
    route_request(request, name)
    body = model_document(name, created=_STARTED, owned_by=_OWNED_BY)
    return web.Response(body=body, content_type="application/json")


async def _relay(request: web.Request) -> web.StreamResponse:
    route_request(request, None)
    return await relay(request)


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/models", list_models), web.get("/v1/models/{name:.+}", get_model)]
