"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.core.backend.readiness import Readiness
from proxy.core.compression.dictionaries import ZstdDictionaries
from proxy.core.endpoints import CHAT, COMPLETIONS
from proxy.core.errors import ConfigError
from proxy.core.http.upgrade import VersionPolicy
from proxy.core.maps.discovery import public_origin
from proxy.core.wire.schema import served_schema
from proxy.dictionaries.load import load_dictionaries
from proxy.maps.publish import publish
from proxy.server import local, well_known
from proxy.server.auth import FORWARD_AUTHORIZATION, api_key_middleware
from proxy.server.drift import drift_context
from proxy.server.errors import error_middleware
from proxy.server.expect import expect_middleware, with_expect_handler
from proxy.server.generation import (
    chat_completions,
    completions,
    completions_codec,
    other_routes,
)
from proxy.server.keys import SAFETY_POLICY, SETTINGS, VOCABULARY
from proxy.server.lifecycle import LIFECYCLE, Lifecycle
from proxy.server.local import READINESS, SCHEMA_TEXT
from proxy.server.metrics import METRICS, Metrics
from proxy.server.models import MODELS, UpstreamModels
from proxy.server.observe import echo_request_id, observe_middleware
from proxy.server.policy_file import read_policy_file
from proxy.server.upstream import UPSTREAM, UpstreamPool, make_session
from proxy.server.versioning import (
    VERSION_NOTICES,
    VERSION_POLICY,
    VersionNotices,
    strip_withheld_headers,
)
from proxy.server.well_known import (
    MAPS,
    PUBLIC_ORIGIN,
    TOKENIZER_MAP,
    ZSTD_DICTIONARIES,
    MapStore,
)
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST, Settings
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary


def routes() -> list[web.RouteDef]:
    handlers = {COMPLETIONS: completions, CHAT: chat_completions}
    generation = [web.post(path, handlers[e]) for e in handlers for path in e.paths]
    return with_expect_handler(
        [
            # The proxy's own and the Codec documents: answered here, never relayed upstream.
            *local.routes(),
            *well_known.routes(),
            *generation,
            web.post("/v1/completions/codec", completions_codec),
            # Everything else, any method: transparent pass-through to the upstream.
            web.route("*", "/{tail:.*}", other_routes),
        ]
    )


def load_app_dictionaries(settings: Settings, vocabulary: Vocabulary) -> ZstdDictionaries:
    """`DictionaryError` if a dictionary does not match its manifest (refuse to start)."""
    manifest = settings.dictionaries_manifest
    return load_dictionaries(
        manifest,
        settings.zstd_dicts,
        vocabulary_sha256=vocabulary.vocabulary_sha256,
        # The shipped manifest may be absent (an installed wheel); one named in settings may not.
        manifest_required=manifest is not None and manifest != DEFAULT_DICTIONARIES_MANIFEST,
    )


def _upstream_context(
    settings: Settings,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        session = make_session(settings)
        pool = UpstreamPool(settings, session, app[METRICS], app[READINESS])
        app[UPSTREAM] = pool
        app[MODELS] = UpstreamModels(pool, settings.model)
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
    # Outermost first: every request is recorded; errors become JSON before they are recorded;
    # `Expect: 100-continue` is answered only once the key is checked.
    middlewares: list[Middleware] = [observe_middleware, error_middleware]
    keys = settings.api_keys()
    auth = api_key_middleware(keys, open_routes=[*local.routes(), *well_known.routes()])
    if auth is not None:
        middlewares.append(auth)
    middlewares.append(expect_middleware)
    # Request bodies are read as sent: Codec requests are decoded by us with a cap on the
    # decoded size (core/http/body_coding.py), pass-through bodies go upstream byte for byte.
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=middlewares,
        handler_args={
            "auto_decompress": False,
            # aiohttp closes a connection with no request this long after it opened or after
            # its previous response; a request head begun is timed by proxy/server/protocol.py.
            "keepalive_timeout": settings.client_keepalive_timeout,
        },
    )
    app[SETTINGS] = settings
    app[FORWARD_AUTHORIZATION] = not keys or settings.forward_authorization
    app[METRICS] = metrics or Metrics()
    app[LIFECYCLE] = Lifecycle()
    app[READINESS] = Readiness()
    if not isinstance(tokenizer, Vocabulary):
        tokenizer = Vocabulary.build(
            tokenizer or load_tokenizer(settings.model_list()[0].tokenizer)
        )
    app[VOCABULARY] = tokenizer
    if dictionaries is None:
        dictionaries = load_app_dictionaries(settings, tokenizer)
    app[ZSTD_DICTIONARIES] = dictionaries
    published = publish(
        tokenizer.loaded, settings.map_id, dictionaries.records, content=tokenizer.map_content
    )
    app[TOKENIZER_MAP] = published
    app[MAPS] = MapStore([published])
    if settings.public_url is not None:
        app[PUBLIC_ORIGIN] = public_origin(settings.public_url)
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    # Chat streams carry tool calls, so field 4 and ToolCall are part of what we emit.
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=True)
    app.on_response_prepare.append(echo_request_id)
    _versioning(app, settings, tokenizer)
    # Order matters: the drift check needs the upstream session.
    app.cleanup_ctx.append(_upstream_context(settings))
    app.cleanup_ctx.append(drift_context(settings))
    app.add_routes(routes())
    return app
