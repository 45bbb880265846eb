"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.core.dictionaries import ZstdDictionaries
from proxy.core.errors import ConfigError
from proxy.core.readiness import Readiness
from proxy.core.schema import served_schema
from proxy.core.upgrade import VersionPolicy
from proxy.maps.publish import publish
from proxy.server import discovery, well_known
from proxy.server.auth import api_key_middleware
from proxy.server.chat import chat_completions
from proxy.server.completions import completions
from proxy.server.dictionaries import dictionary_handler, load_app_dictionaries
from proxy.server.drift import drift_context
from proxy.server.errors import error_middleware
from proxy.server.keys import (
    LIFECYCLE,
    MAPS,
    METRICS,
    MODEL,
    READINESS,
    SAFETY_POLICY,
    SCHEMA_TEXT,
    SETTINGS,
    TOKENIZER_MAP,
    UPSTREAM,
    VERSION_NOTICES,
    VERSION_POLICY,
    VOCABULARY,
    ZSTD_DICTIONARIES,
    Vocabulary,
)
from proxy.server.lifecycle import Lifecycle
from proxy.server.map_store import MapStore
from proxy.server.metrics import Metrics
from proxy.server.model import ModelResolver
from proxy.server.notices import VersionNotices
from proxy.server.observe import echo_request_id, observe_middleware
from proxy.server.path_b import completions_codec
from proxy.server.policy_file import read_policy_file
from proxy.server.probes import livez
from proxy.server.probes import metrics as metrics_handler
from proxy.server.readiness import method_not_allowed, readyz
from proxy.server.relay import relay_handler
from proxy.server.upstream import UpstreamPool, make_session
from proxy.server.versioning import strip_withheld_headers
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
        *(web.route("*", path, method_not_allowed) for path in ("/livez", "/readyz", "/metrics")),
        web.get("/codec/schema", schema),
        # Version and safety-policy documents first, then every other discovery path: all
        # answered here, never relayed (any method; the handler sorts them out).
        web.get("/.well-known/codec/dicts/{name}", dictionary_handler),
        *well_known.routes(),
        web.route("*", r"/.well-known/codec{tail:(/.*)?}", discovery.well_known),
        web.post("/v1/completions", completions),
        web.post("/v1/completions/codec", completions_codec),
        web.post("/v1/chat/completions", chat_completions),
        # Everything else, any method: transparent pass-through to the upstream.
        web.route("*", "/{tail:.*}", relay_handler),
    ]


def _upstream_context(
    settings: Settings,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        session = make_session(settings)
        pool = UpstreamPool(settings, session, app[METRICS], app[READINESS])
        app[UPSTREAM] = pool
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


def _versioning(app: web.Application, settings: Settings, vocabulary: Vocabulary) -> None:
    """Version policy, safety policy, and the one place the header floors are applied."""
    if settings.enforce_safety_policy and settings.safety_policy is None:
        raise ConfigError("enforce_safety_policy needs a safety policy file (safety_policy)")
    app[VERSION_POLICY] = VersionPolicy(
        mode=settings.version_policy,
        enforce_safety_policy=settings.enforce_safety_policy,
        deployment_id=settings.deployment_id,
        docs_url=settings.docs_url,
    )
    app[VERSION_NOTICES] = VersionNotices()
    if settings.safety_policy is not None:
        app[SAFETY_POLICY] = read_policy_file(settings.safety_policy, vocabulary.loaded)
    app.on_response_prepare.append(strip_withheld_headers)


def create_app(
    settings: Settings,
    tokenizer: LoadedTokenizer | Vocabulary | None = None,
    *,
    dictionaries: ZstdDictionaries | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """Build the proxy. The tokenizer is loaded here unless the caller already has it.

    `dictionaries` are the zstd dictionaries the proxy compresses with (default: loaded as the
    settings say); its tokenizer map declares them (`zstd_dictionaries[]`). Raises
    TokenizerLoadError, TokenizerMapError, DictionaryError or ConfigError.
    """
    # Outermost first: every request is recorded; errors become JSON before they are recorded.
    middlewares: list[Middleware] = [observe_middleware, error_middleware]
    auth = api_key_middleware(settings.api_keys())
    if auth is not None:
        middlewares.append(auth)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=middlewares,
        # Request bodies are read as sent: Codec requests are decoded by us with a cap on the
        # decoded size (core/body_coding.py), pass-through bodies go upstream byte for byte.
        handler_args={"auto_decompress": False},
    )
    app[SETTINGS] = settings
    app[METRICS] = metrics or Metrics()
    app[LIFECYCLE] = Lifecycle()
    app[READINESS] = Readiness()
    if not isinstance(tokenizer, Vocabulary):
        tokenizer = Vocabulary.build(tokenizer or load_tokenizer(settings.tokenizer))
    app[VOCABULARY] = tokenizer
    if dictionaries is None:
        dictionaries = load_app_dictionaries(settings, tokenizer)
    app[ZSTD_DICTIONARIES] = dictionaries
    published = publish(
        tokenizer.loaded, settings.map_id, dictionaries.records, content=tokenizer.map_content
    )
    app[TOKENIZER_MAP] = published
    app[MAPS] = MapStore([published])
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    # Chat streams carry tool calls, so field 4 and ToolCall are part of what we emit.
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=True)
    app[MODEL] = ModelResolver(settings.model)
    app.on_response_prepare.append(echo_request_id)
    _versioning(app, settings, tokenizer)
    # Order matters: the drift check needs the upstream session.
    app.cleanup_ctx.append(_upstream_context(settings))
    app.cleanup_ctx.append(drift_context(settings))
    app.add_routes(routes())
    return app
