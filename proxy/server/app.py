"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from importlib import resources

from aiohttp import web

from proxy.core.schema import served_schema
from proxy.server.chat import chat_completions
from proxy.server.completions import completions
from proxy.server.errors import error_middleware
from proxy.server.keys import MODEL, SCHEMA_TEXT, SETTINGS, UPSTREAM, VOCABULARY, Vocabulary
from proxy.server.model import ModelResolver
from proxy.server.path_b import completions_codec
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
        web.post("/v1/completions/codec", completions_codec),
        web.post("/v1/chat/completions", chat_completions),
        web.get("/codec/schema", schema),
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
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    if not isinstance(tokenizer, Vocabulary):
        tokenizer = Vocabulary.build(tokenizer or load_tokenizer(settings.tokenizer))
    app[VOCABULARY] = tokenizer
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    # Chat streams carry tool calls, so field 4 and ToolCall are part of what we emit.
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=True)
    app[MODEL] = ModelResolver(settings.model)
    app.cleanup_ctx.append(_upstream_context(settings))
    app.add_routes(routes())
    return app
