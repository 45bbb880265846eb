"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.core.schema import served_schema
from proxy.server.auth import api_key_middleware
from proxy.server.completions import completions
from proxy.server.errors import error_middleware
from proxy.server.keys import (
    LIFECYCLE,
    METRICS,
    SCHEMA_TEXT,
    SETTINGS,
    UPSTREAM,
    VOCABULARY,
    Vocabulary,
)
from proxy.server.lifecycle import Lifecycle
from proxy.server.metrics import Metrics
from proxy.server.observe import echo_request_id, observe_middleware
from proxy.server.probes import livez, readyz
from proxy.server.probes import metrics as metrics_handler
from proxy.server.relay import relay_handler
from proxy.server.upstream import UpstreamPool, make_session
from proxy.settings import Settings
from proxy.tokenizers import LoadedTokenizer, load_tokenizer


async def schema(request: web.Request) -> web.Response:
    """`GET /codec/schema`: the proto3 schema of exactly what we emit (codec-spec.md §3.4)."""
    return web.Response(text=request.app[SCHEMA_TEXT], content_type="text/plain")


def routes() -> list[web.RouteDef]:
    return [
        # The proxy's own: never relayed upstream, never behind an API key.
        web.get("/livez", livez),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics_handler),
        web.get("/codec/schema", schema),
        web.post("/v1/completions", completions),
        # Everything else, any method: transparent pass-through to the upstream.
        web.route("*", "/{tail:.*}", relay_handler),
    ]


def _upstream_context(
    settings: Settings,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        session = make_session(settings)
        pool = UpstreamPool(settings, session, app[METRICS])
        app[UPSTREAM] = pool
        app[LIFECYCLE].checks["upstreams"] = lambda: (
            None if pool.balancer.any_available(time.monotonic()) else "no upstream available"
        )
        await pool.check_health()  # know who is up before the first request
        checker = asyncio.create_task(pool.health_loop(), name="upstream-health")
        try:
            yield
        finally:
            checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checker
            await session.close()

    return context


def create_app(
    settings: Settings,
    tokenizer: LoadedTokenizer | Vocabulary | None = None,
    *,
    metrics: Metrics | None = None,
) -> web.Application:
    """Build the proxy. The tokenizer is loaded here unless the caller already has it."""
    # Outermost first: every request is recorded; errors become JSON before they are recorded.
    middlewares: list[Middleware] = [observe_middleware, error_middleware]
    auth = api_key_middleware(settings.api_keys())
    if auth is not None:
        middlewares.append(auth)
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    app[METRICS] = metrics or Metrics()
    app[LIFECYCLE] = Lifecycle()
    if not isinstance(tokenizer, Vocabulary):
        tokenizer = Vocabulary.build(tokenizer or load_tokenizer(settings.tokenizer))
    app[VOCABULARY] = tokenizer
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=False)
    app.on_response_prepare.append(echo_request_id)
    app.cleanup_ctx.append(_upstream_context(settings))
    app.add_routes(routes())
    return app
