"""The models behind the proxy: each with its own upstreams, tokenizer, map, dictionaries,
readiness and drift check, and the routing from a request's `model` to one of them.

What is per model never leaks to another: a model whose backend drifts or is down has its
Codec requests refused (503) and its readiness checks failing, while the others serve; a model
whose backend stalls fills its own share of `max_streams` (`models[].max_streams`), not the
others'. The one upstream `ClientSession` (one connection pool, `pool_limit`) and `max_streams`
itself are shared: they bound the process, not a model.

A model whose upstream speaks Codec (`upstream_protocol = "codec"`) has none of the tokenizer
side (vocabulary, published map, dictionaries, drift check, verification): the upstream's own
map is its tokenizer, fetched and pinned by digest (`UpstreamMaps`, upstream_maps.py), and
`/readyz` says whether it is.

`SERVED_MODELS` is set by the app factory; the pools, health loops and drift checks start in
`served_models_context` (cleanup_ctx). A request's model is routed once and kept on it (`MODEL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.core.backend.drift import DriftState, DriftVerdict
from proxy.core.backend.readiness import Readiness
from proxy.core.backend.routing import NO_MODEL, UNKNOWN_MODEL, ModelRoutes
from proxy.core.client.assets import CodecAssets
from proxy.core.compression.dictionaries import ZstdDictionaries
from proxy.core.errors import BadRequest, ConfigError, ProxyError
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.core.wire.prompt_ids import PromptLimits
from proxy.dictionaries.load import load_dictionaries
from proxy.maps.publish import publish
from proxy.server.data.upstreams import (
    ProcessStreams,
    StreamBudget,
    UpstreamClients,
    UpstreamPool,
)
from proxy.server.models.drift import DriftMonitor
from proxy.server.models.live import Live
from proxy.server.models.upstream_maps import UpstreamMaps
from proxy.server.models.upstream_models import UpstreamModels
from proxy.server.models.verification import ModelVerification
from proxy.server.telemetry.metrics import Metrics
from proxy.server.telemetry.record import RECORD
from proxy.settings import (
    CODEC,
    DEFAULT_DICTIONARIES_MANIFEST,
    DEFAULT_MAX_PROMPT_IDS,
    ModelConfig,
    Settings,
)
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

log = logging.getLogger("codec_proxy")

# The IDs a frame can carry (uint32): what a token-ID prompt is checked against when the model
# has no vocabulary of its own yet (a Codec upstream's map not pinned), the upstream checking it.
_FRAME_ID_LIMIT = 1 << 32


class ServedModel:
    """One model: what was built for it at start, and its upstream side once running.

    A model behind a Codec upstream (`speaks_codec`) has no `vocabulary`, `published` map or
    `verification` (reading them is a bug), and its `upstream_maps` once running."""

    def __init__(
        self,
        config: ModelConfig,
        vocabulary: Vocabulary | None,
        dictionaries: ZstdDictionaries,
        published: PublishedMap | None,
    ) -> None:
        self.config = config
        self.name = config.name  # also its metric label
        self._vocabulary = vocabulary
        self.dictionaries = dictionaries
        self._published = published
        self.readiness = Readiness()
        self._verification = (
            None if published is None
            else ModelVerification(config.name, published, self.readiness)
        )  # fmt: skip
        self._pool: UpstreamPool | None = None
        self._listing: UpstreamModels | None = None
        self.drift: DriftMonitor | None = None
        self.upstream_maps: UpstreamMaps | None = None

    @property
    def speaks_codec(self) -> bool:
        """The upstream speaks Codec: JSON clients get JSON rendered from its frames."""
        return self.config.upstream_protocol == CODEC

    @property
    def vocabulary(self) -> Vocabulary:
        if self._vocabulary is None:
            raise RuntimeError(f"model {self.name!r}: a Codec upstream's model has no tokenizer")
        return self._vocabulary

    @property
    def published(self) -> PublishedMap:
        if self._published is None:
            raise RuntimeError(f"model {self.name!r}: a Codec upstream's model publishes no map")
        return self._published

    @property
    def verification(self) -> ModelVerification:
        if self._verification is None:
            raise RuntimeError(f"model {self.name!r}: a Codec upstream's model verifies nothing")
        return self._verification

    @property
    def pool(self) -> UpstreamPool:
        if self._pool is None:
            raise RuntimeError(f"model {self.name!r}: the upstream pool starts with the app")
        return self._pool

    @property
    def listing(self) -> UpstreamModels:
        """The upstream's own `/v1/models` (context length, backend kind, Path B's name)."""
        if self._listing is None:
            raise RuntimeError(f"model {self.name!r}: the upstream pool starts with the app")
        return self._listing

    def attach(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._listing = UpstreamModels(pool, self.lookup_name)

    @property
    def lookup_name(self) -> str | None:
        """The name the upstream knows this model by, when the proxy knows it (None: the
        upstream's only model, as `upstream` without `model` always meant)."""
        return self.config.upstream_model or self.config.request_default

    def upstream_name(self, requested: str | None) -> str | None:
        """What a Codec request's body says upstream: `upstream_model`, else the name the
        client sent, else the model's default (None: the upstream's only model)."""
        return self.config.upstream_model or requested or self.config.request_default

    def codec_retry_after(self, now: float) -> int:
        """Seconds a client refused Codec for this model should wait before asking again: until
        the next drift check, which is what lifts a refusal short of a reload (the check's
        interval while none is scheduled). `now` is `time.monotonic()`."""
        due = self.drift.next_round if self.drift is not None else None
        seconds = self.config.drift_check_interval if due is None else due - now
        return max(1, math.ceil(seconds))

    def prompt_limits(self, max_prompt_ids: int | None) -> PromptLimits:
        """`max_prompt_ids`, else the backend's context length as last listed, else the default."""
        context = self._listing.context_length() if self._listing is not None else None
        limit = max_prompt_ids or context or DEFAULT_MAX_PROMPT_IDS
        if self._vocabulary is not None:
            return PromptLimits(self._vocabulary.loaded.vocab_size, limit)
        pinned = None if self.upstream_maps is None else self.upstream_maps.vocab_size
        return PromptLimits(pinned or _FRAME_ID_LIMIT, limit)


class ServedModels:
    """Every model, the default first, and the names that route to them."""

    def __init__(self, models: Sequence[ServedModel], *, any_name: bool = False) -> None:
        self.models = {model.name: model for model in models}
        self.default = models[0]
        self.routes = ModelRoutes.build(
            ((m.name, m.config.names) for m in models), any_name=any_name
        )

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models.values())

    def route(self, requested: object, *, unread_body: bool = False) -> ServedModel:
        """The model for a request's `model` value; 404 `model_not_found` for a name none
        answers to, before any upstream contact (`unread_body`: see `ModelRoutes.route`)."""
        return self.models[self.routes.route(requested, unread_body=unread_body)]

    @property
    def listed_names(self) -> tuple[str, ...] | None:
        """The names `GET /v1/models` answers with; None when any name is served (the
        upstream's own listing is relayed, as before several models)."""
        if self.routes.any_name:
            return None
        return tuple(name for model in self for name in model.config.names)

    @property
    def maps(self) -> tuple[PublishedMap, ...]:
        """Each model's map, once (models sharing a tokenizer and id share their map); a Codec
        upstream's maps are `pinned_map`'s."""
        published = (m.published for m in self if not m.speaks_codec)
        return tuple({p.digest: p for p in published}.values())

    def pinned_map(self, digest: str) -> PublishedMap | None:
        """A Codec upstream's verified map by its digest: its answers relayed to this proxy's
        Codec clients name it, and they fetch it here."""
        for model in self:
            found = None if model.upstream_maps is None else model.upstream_maps.published(digest)
            if found is not None:
                return found
        return None

    def dictionary(self, hex_digest: str) -> bytes | None:
        """Any model's dictionary by its sha256 (they are content-addressed: never ambiguous),
        a Codec upstream's verified ones included."""
        for model in self:
            found = model.dictionaries.by_hex(hex_digest)
            if found is not None:
                return found.data
            pinned = model.upstream_maps
            data = None if pinned is None else pinned.dictionary(hex_digest)
            if data is not None:
                return data
        return None

    def ready(self) -> bool:
        return all(m.readiness.ready for m in self if m.config.required)

    def report(self, process: Readiness) -> dict[str, Any]:
        """The `/readyz` body: ready when the process and every required model are.

        `checks` holds the process's and the default model's checks (what a single-model
        proxy always reported); `models` every model's.
        """
        report = process.report()
        reasons: list[dict[str, Any]] = list(report["reasons"])
        for model in self:
            if model.config.required:
                reasons += [
                    {**reason, "model": model.name}
                    for reason in model.readiness.report()["reasons"]
                ]
        default = self.default.readiness.report()
        return {
            "status": "ready" if not reasons else "not_ready",
            "reasons": reasons,
            "checks": {**report["checks"], **default["checks"]},
            "models": {
                model.name: {
                    "ready": model.readiness.ready,
                    "required": model.config.required,
                    "codec": model.readiness.codec_refusal() is None,
                    "checks": model.readiness.report()["checks"],
                }
                for model in self
            },
        }

    def lift_verification(self) -> None:
        """After a reload: no model refuses Codec for verification mismatches any more."""
        for model in self:
            if not model.speaks_codec:
                model.verification.lift()

    def publish_gauges(self, metrics: Metrics, live: Live) -> None:
        """Per-model state gauges, as of now (set again whenever a check reports, and after a
        reload: `live` holds the rollout switches in force)."""
        for model in self:
            drift = model.drift
            drifted = drift is not None and drift.verdict.state is DriftState.MISMATCHED
            metrics.drift_detected.labels(model.name).set(1 if drifted else 0)
            switched_on = live.settings.codec_enabled and live.model(model.name).codec_enabled
            codec = switched_on and model.readiness.codec_refusal() is None
            metrics.codec_available.labels(model.name).set(1 if codec else 0)
            metrics.model_ready.labels(model.name).set(1 if model.readiness.ready else 0)


SERVED_MODELS = web.AppKey("served_models", ServedModels)
MODEL = web.RequestKey("model", ServedModel)


def route_request(
    request: web.Request, requested: object, *, unread_body: bool = False
) -> ServedModel:
    """Route `request` by the model it names (None: none), once; later calls keep the first."""
    if MODEL in request:
        return request[MODEL]
    record = request.get(RECORD)
    try:
        model = request.app[SERVED_MODELS].route(requested, unread_body=unread_body)
    except BadRequest:
        if record is not None:
            record.model = UNKNOWN_MODEL  # never the name the client sent: labels stay bounded
        raise
    request[MODEL] = model
    if record is not None:
        record.model = model.name
    return model


def model_of(request: web.Request) -> ServedModel:
    """The model this request was routed to (the default until routed)."""
    return request.get(MODEL) or request.app[SERVED_MODELS].default


def model_label(request: web.Request) -> str:
    model = request.get(MODEL)
    return NO_MODEL if model is None else model.name


Tokenizers = LoadedTokenizer | Vocabulary | Mapping[str, LoadedTokenizer | Vocabulary]


def build_served_models(
    settings: Settings,
    tokenizers: Tokenizers | None = None,
    *,
    dictionaries: ZstdDictionaries | None = None,
) -> ServedModels:
    """Load every model's tokenizer (once per file), dictionaries and map.

    `tokenizers`: already loaded ones, for the default model or by model name (the rest are
    loaded from their files); `dictionaries`: the default model's, instead of loading them.
    Raises TokenizerLoadError, TokenizerMapError, DictionaryError or ConfigError, each naming
    the model when there are several.
    """
    configs = settings.model_list()
    given: Mapping[str, LoadedTokenizer | Vocabulary]
    if tokenizers is None:
        given = {}
    elif isinstance(tokenizers, LoadedTokenizer | Vocabulary):
        given = {configs[0].name: tokenizers}
    else:
        given = tokenizers
    by_file: dict[str, Vocabulary] = {}
    built: list[ServedModel] = []
    maps: dict[str, PublishedMap] = {}
    for config in configs:
        if config.upstream_protocol == CODEC:
            built.append(ServedModel(config, None, ZstdDictionaries(), None))
            continue
        with _naming(config, several=len(configs) > 1):
            vocabulary = _vocabulary(config, given.get(config.name), by_file)
            chosen = (
                dictionaries
                if config.is_default and dictionaries is not None
                else _dictionaries(settings, config, vocabulary)
            )
            published = publish(
                vocabulary.loaded, config.map_id, chosen.records, content=vocabulary.map_content
            )
            other = maps.setdefault(published.id, published)
            if other.digest != published.digest:
                raise ConfigError(
                    f"map id {published.id!r} is another model's with other contents; "
                    "give this model its own map_id"
                )
            built.append(ServedModel(config, vocabulary, chosen, published))
    return ServedModels(built, any_name=configs[0].any_name)


@contextlib.contextmanager
def _naming(config: ModelConfig, *, several: bool) -> Iterator[None]:
    """Errors while building a model name it, when there is more than one."""
    try:
        yield
    except ProxyError as exc:
        if several:
            # The same error, its one line now saying whose: start-up prints exactly this.
            exc.message = f"model {config.name!r}: {exc.message}"
            exc.args = (exc.message,)
        raise


def _vocabulary(
    config: ModelConfig,
    given: LoadedTokenizer | Vocabulary | None,
    by_file: dict[str, Vocabulary],
) -> Vocabulary:
    if isinstance(given, Vocabulary):
        return given
    assert config.tokenizer is not None  # settings.py: a JSON upstream's model has one
    key = str(config.tokenizer.resolve())
    if given is None and key in by_file:
        return by_file[key]  # two names for one tokenizer: loaded once, one map
    vocabulary = Vocabulary.build(given or load_tokenizer(config.tokenizer))
    by_file.setdefault(key, vocabulary)
    return vocabulary


def _dictionaries(
    settings: Settings, config: ModelConfig, vocabulary: Vocabulary
) -> ZstdDictionaries:
    """`DictionaryError` if a dictionary does not match its manifest or its model's tokenizer."""
    manifest = settings.dictionaries_manifest
    return load_dictionaries(
        manifest,
        config.zstd_dicts,
        vocabulary_sha256=vocabulary.vocabulary_sha256,
        # The shipped manifest may be absent (an installed wheel); one named in settings may not.
        manifest_required=manifest is not None and manifest != DEFAULT_DICTIONARIES_MANIFEST,
    )


def served_models_context(
    settings: Settings, on_change: Callable[[], None]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: every model's pool (the clients shared), health loop and drift check.

    `on_change` runs after every health round and drift verdict (it republishes the gauges).
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        from proxy.server.telemetry.metrics import METRICS

        served = app[SERVED_MODELS]
        metrics = app[METRICS]
        clients = UpstreamClients.for_settings(settings)
        process = ProcessStreams(settings.max_streams)
        metrics.max_streams.set(process.limit)
        assets = CodecAssets()  # Codec upstreams' maps, shared: one decoder per digest
        for model in served:
            limit = model.config.max_streams
            metrics.model_max_streams.labels(model.name).set(limit)
            pool = UpstreamPool(
                settings,
                clients,
                metrics,
                model.readiness,
                upstreams=model.config.upstreams,
                model=model.name,
                budget=StreamBudget(limit, process, model=model.name, metrics=metrics),
            )
            model.attach(pool)
            if model.speaks_codec:
                names = (model.lookup_name, *model.config.names)
                model.upstream_maps = UpstreamMaps(
                    model.name,
                    pool,
                    model.readiness,
                    metrics,
                    assets,
                    names=tuple(dict.fromkeys(n for n in names if n is not None)),
                    stream_format=model.config.upstream_stream_format,
                )
            elif settings.verify_sample_rate > 0:
                model.verification.prepare()
        tasks: list[asyncio.Task[None]] = []
        try:
            # Know who is up before the first request; every model's first round at once.
            await asyncio.gather(*(model.pool.check_health() for model in served))
            on_change()
            for model in served:
                tasks.append(asyncio.create_task(_health(model, on_change)))
            await asyncio.gather(*(_first_drift_check(model, tasks, on_change) for model in served))
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for model in served:
                if model.upstream_maps is not None:
                    await model.upstream_maps.close()
            await clients.close()

    return context


async def _health(model: ServedModel, on_change: Callable[[], None]) -> None:
    interval = model.pool.settings.health_interval
    while True:
        await asyncio.sleep(interval)
        await model.pool.check_health()
        on_change()


async def _first_drift_check(
    model: ServedModel, tasks: list[asyncio.Task[None]], on_change: Callable[[], None]
) -> None:
    """The first check before serving, then the periodic one (or the check turned off). A
    Codec upstream has no tokenizer to compare: its map is pinned instead (upstream_maps.py),
    first before serving, then retried until it is."""
    config = model.config
    maps = model.upstream_maps
    if maps is not None:
        settled = await maps.pin_from_index()
        on_change()
        if not settled:

            async def retried() -> None:
                await maps.run()
                on_change()

            tasks.append(asyncio.create_task(retried()))
        return
    if not config.drift_check:
        model.readiness.update(
            DriftVerdict(DriftState.DISABLED, "the drift check is turned off").check()
        )
        return

    def on_verdict() -> None:
        # A clean check is what lifts a refusal for verification mismatches, short of a reload.
        if monitor.verdict.state is DriftState.MATCHED:
            model.verification.lift()
        on_change()

    monitor = DriftMonitor(
        model.pool,
        model.listing,
        model.vocabulary,
        model.readiness,
        model=model.lookup_name,
        on_verdict=on_verdict,
    )
    model.drift = monitor
    concluded = await monitor.check()
    on_change()
    tasks.append(asyncio.create_task(monitor.run(config.drift_check_interval, concluded=concluded)))
