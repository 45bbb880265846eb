"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from importlib import resources

from aiohttp import web

from proxy.core.schema import served_schema
from proxy.server.completions import completions
from proxy.server.dictionaries import dictionary_handler, load_app_dictionaries
from proxy.server.errors import error_middleware
from proxy.server.keys import (
    SCHEMA_TEXT,
    SETTINGS,
    UPSTREAM,
    VOCABULARY,
    ZSTD_DICTIONARIES,
    Vocabulary,
)
from proxy.server.relay import relay_handler
from proxy.server.upstream import Upstream, make_session
from proxy.settings import Settings
from proxy.tokenizers import LoadedTokenizer, load_tokenizer


async def schema(request: web.Request) -> web.Response:
    """`GET /codec/schema`: the proto3 schema of exactly what we emit (codec-spec.md §3.4)."""
    return web.Response(text=request.app[SCHEMA_TEXT], content_type="text/plain")


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/completions", completions),
        web.get("/codec/schema", schema),
        web.get("/.well-known/codec/dicts/{name}", dictionary_handler),
        # Everything else, any method: transparent pass-through to the upstream.
        web.route("*", "/{tail:.*}", relay_handler),
    ]


def _upstream_context(
    settings: Settings,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        session = make_session(settings)
        app[UPSTREAM] = Upstream(settings.upstream, session)
        try:
            yield
        finally:
            await session.close()

    return context


def create_app(
    settings: Settings, tokenizer: LoadedTokenizer | Vocabulary | None = None
) -> web.Application:
    """Build the proxy. The tokenizer is loaded here unless the caller already has it."""
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware],
        # Request bodies are read as sent: Codec requests are decoded by us with a cap on the
        # decoded size (core/body_coding.py), pass-through bodies go upstream byte for byte.
        handler_args={"auto_decompress": False},
    )
    app[SETTINGS] = settings
    if not isinstance(tokenizer, Vocabulary):
        tokenizer = Vocabulary.build(tokenizer or load_tokenizer(settings.tokenizer))
    app[VOCABULARY] = tokenizer
    app[ZSTD_DICTIONARIES] = load_app_dictionaries(settings, tokenizer)
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=False)
    app.cleanup_ctx.append(_upstream_context(settings))
    app.add_routes(routes())
    return app
