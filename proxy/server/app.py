"""The app factory: settings and tokenizer in, a ready `web.Application` out."""

from __future__ import annotations

from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.core.backend.readiness import Readiness
from proxy.core.compression.dictionaries import ZstdDictionaries
from proxy.core.endpoints import CHAT, CODEC_REQUEST_PATH, COMPLETIONS
from proxy.core.maps.discovery import public_origin
from proxy.core.wire.schema import served_schema
from proxy.native import DATA_PATH
from proxy.server.control import local, model_list, well_known
from proxy.server.control.admin import ADMIN_APP, admin_app
from proxy.server.control.auth import KeyCheck
from proxy.server.control.edge import edge_middleware, response_headers
from proxy.server.control.expect import with_expect_handler
from proxy.server.control.generation import (
    chat_completions,
    completions,
    completions_codec,
    other_routes,
)
from proxy.server.control.local import SCHEMA_TEXT
from proxy.server.control.versioning import VERSION_NOTICES, VersionNotices
from proxy.server.control.well_known import MAPS, PUBLIC_ORIGIN, MapStore
from proxy.server.data.drain import LIFECYCLE, READINESS, Lifecycle
from proxy.server.models.live import LIVE, LiveConfig, build_live
from proxy.server.models.served_models import (
    SERVED_MODELS,
    Tokenizers,
    build_served_models,
    served_models_context,
)
from proxy.server.process.reload import ON_RELOAD, install_reloads
from proxy.server.telemetry.metrics import METRICS, Metrics
from proxy.server.telemetry.worker_tracer import WORKER_TRACER, WorkerTracer
from proxy.settings import Settings
from proxy.trace_endpoint import trace_endpoint


def routes(*, probes: bool = True) -> list[web.RouteDef]:
    """The serving port's routes; `probes=False` when an admin listener answers the probes."""
    handlers = {COMPLETIONS: completions, CHAT: chat_completions}
    generation = [web.post(path, handlers[e]) for e in handlers for path in e.paths]
    return with_expect_handler(
        [
            # The proxy's own and the Codec documents: answered here, never relayed upstream.
            *local.routes(probes=probes),
            *well_known.routes(),
            *generation,
            web.post(CODEC_REQUEST_PATH, completions_codec),
            # The configured models' names (the backend's own listing for one unnamed model).
            *model_list.routes(),
            # Everything else, any method: transparent pass-through to the upstream.
            web.route("*", "/{tail:.*}", other_routes),
        ]
    )


def create_app(
    settings: Settings,
    tokenizer: Tokenizers | None = None,
    *,
    dictionaries: ZstdDictionaries | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """Build the proxy. Tokenizers are loaded here unless the caller already has them.

    `tokenizer`: the default model's (a `LoadedTokenizer` or `Vocabulary`), or several by model
    name. `dictionaries`: the default model's zstd dictionaries (default: loaded as the
    settings say); its tokenizer map declares them (`zstd_dictionaries[]`). Raises
    TokenizerLoadError, TokenizerMapError, DictionaryError or ConfigError.
    """
    # Before the tokenizers load (the CLI has checked it before the workers start).
    endpoint = trace_endpoint(settings.otlp_traces_endpoint)
    served = build_served_models(settings, tokenizer, dictionaries=dictionaries)
    live = build_live(settings, {m.name: m.vocabulary for m in served if not m.speaks_codec})
    # With an admin listener the probes and the proxy's metrics are there, and these paths are
    # relayed here like any other (server/control/admin.py).
    probes = settings.admin_port is None
    # The request's configuration snapshot; every request is recorded; errors become JSON
    # before they are recorded; `Expect: 100-continue` is answered only once the key is
    # checked: in one middleware (server/control/edge.py).
    middlewares: list[Middleware] = [
        edge_middleware(KeyCheck(open_routes=[*local.routes(probes=probes), *well_known.routes()]))
    ]
    # Request bodies are read as sent: Codec requests are decoded by us with a cap on the
    # decoded size (core/http/body_coding.py), pass-through bodies go upstream byte for byte.
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=middlewares,
        handler_args={
            "auto_decompress": False,
            # aiohttp closes a connection with no request this long after it opened or after
            # its previous response; a request head begun is timed by
            # proxy/server/data/client_protocol.py.
            "keepalive_timeout": settings.client_keepalive_timeout,
        },
    )
    app[LIVE] = LiveConfig(live)
    app[METRICS] = metrics = metrics or Metrics()
    metrics.data_path.labels(DATA_PATH).set(1)
    metrics.prepare(model.name for model in served)
    app[LIFECYCLE] = Lifecycle()
    app[READINESS] = Readiness()
    app[SERVED_MODELS] = served
    app[MAPS] = MapStore(served.maps)
    if settings.public_url is not None:
        app[PUBLIC_ORIGIN] = public_origin(settings.public_url)
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    # Chat streams carry tool calls, so field 4 and ToolCall are part of what we emit.
    app[SCHEMA_TEXT] = served_schema(proto, tool_calls=True)
    app[VERSION_NOTICES] = VersionNotices()
    if endpoint is not None:
        # Started first, so that it is shut down last: after the streams and their upstreams.
        tracer = app[WORKER_TRACER] = WorkerTracer(
            endpoint, trust_callers=settings.trust_trace_context
        )
        app.cleanup_ctx.append(tracer.context)
    # The request id, the trace, the server version, then the header floors, in one hook.
    app.on_response_prepare.append(response_headers)

    install_reloads(app)
    # The per-model gauges say whether Codec is switched on, which a reload may change; a
    # reload also ends a refusal for verification mismatches.
    app[ON_RELOAD].append(lambda _: served.lift_verification())
    app[ON_RELOAD].append(lambda current: served.publish_gauges(metrics, current))
    app.cleanup_ctx.append(
        served_models_context(settings, lambda: served.publish_gauges(metrics, app[LIVE].current))
    )
    app.add_routes(routes(probes=probes))
    if not probes:
        app[ADMIN_APP] = admin_app(app)
    return app
