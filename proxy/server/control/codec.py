"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

Every Codec entry point (Path A `/v1/completions`, chat, Path B `/v1/completions/codec`) builds
a `CodecPlan` with `codec_plan` and calls `serve_codec`. The bytes are pumped through a
`CodecBody` (proxy/core/bodies.py: the transcoder, the guard that applies the client's
finish-reason floor and the safety policy, and the body writer that encodes, compresses and
flushes) by the shared pump (proxy/server/data/pump.py). This module only decides the plan and
the headers, asks the upstream, and ends the exchange.

The response starts once the first frame is ready and the token source is known. Until then
nothing has reached the client, so a timeout or an upstream failure is still a clean HTTP error
(504/502); after it, every failure becomes the one terminal error frame.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from proxy.core.backend.kind import backend_kind
from proxy.core.bodies import CodecBody, verified_codec_body
from proxy.core.compression.body_writer import BodyWriter, flush_config_for
from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.dictionaries import LoadedZstdDictionary
from proxy.core.compression.flush import FlushConfig
from proxy.core.endpoints import Endpoint
from proxy.core.errors import ProxyError, ServiceUnavailable
from proxy.core.guard import StreamGuard
from proxy.core.http.content_coding import IDENTITY, ZSTD, ContentCoding, negotiate_coding
from proxy.core.http.negotiation import wants_prefixed_msgpack
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.http.versioning import ClientVersion
from proxy.core.safety.stream import PolicedIds
from proxy.core.shown import quoted
from proxy.core.stream.token_source import RETOKENIZED, TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.frames import FrameEncoder, encoder_for
from proxy.server.control.auth import presented_key
from proxy.server.control.exchanges import stream_context
from proxy.server.control.headers import combined_header, forward_headers
from proxy.server.control.relay import relay_response
from proxy.server.control.versioning import (
    client_version_label,
    codec_gate,
    declared_client_version,
)
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.stream import StreamedResponse, StreamEnd, stream_response
from proxy.server.models.live import LIVE, config_of
from proxy.server.models.served_models import SERVED_MODELS, ServedModel, model_of
from proxy.server.models.verification import verdict_label
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD
from proxy.server.telemetry.request_trace import TRACE

log = logging.getLogger("codec_proxy")

# The client's content negotiation is about the Codec response, not the upstream's SSE: the
# upstream must send plain, uncompressed SSE that we can parse.
_UPSTREAM_DROP = ("accept", "accept-encoding", "content-type", "content-encoding")
_UPSTREAM_ADD = [
    ("Accept", "text/event-stream"),
    ("Accept-Encoding", "identity"),
    ("Content-Type", "application/json"),
]
# An upstream that refuses the token-ID fields we added (auto mode) is asked again without.
_REFUSED = frozenset({400, 422})
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True)
class CodecPlan:
    """Everything decided about a Codec response before the upstream is contacted."""

    endpoint: Endpoint
    upstream_path: str
    upstream: UpstreamRequest
    client: ClientVersion
    encoder: FrameEncoder
    # Where the frames' IDs come from (core/stream/token_source.py).
    token_ids: TokenIdMode = "retokenize"
    # Path B: CodecRequest names no model; use --model or the upstream's only one.
    resolve_model: bool = False
    # `Codec-Tokenizer-Map: <id> sha256:<64 hex>` of the map the IDs follow (floor v0.2).
    tokenizer_map: str | None = None
    # Negotiated from Accept-Encoding (core/http/content_coding.py); zstd carries its dictionary.
    coding: ContentCoding = IDENTITY
    zstd_dictionary: LoadedZstdDictionary | None = None

    def response_headers(self, token_source: str) -> dict[str, str]:
        headers = {
            "Content-Type": self.encoder.content_type,
            # Intermediaries must neither cache nor buffer a token stream (peers.md must-have 3).
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            # The body depends on both (v0.6-wire §2.2: Codec-Client-Version, or caches poison).
            "Vary": "Accept-Encoding, Codec-Client-Version",
            # The format actually sent: `protobuf` answers a `protobuf-delta` request
            # (codec-spec.md §1.5, §11 item 29: the I-D's unnamed fall-back header).
            "Codec-Stream-Format": self.encoder.stream_format,
            # `backend` (the model's sampled IDs) or `retokenized` (core/stream/token_source.py).
            "Codec-Token-Source": token_source,
        }
        if self.tokenizer_map is not None:
            headers["Codec-Tokenizer-Map"] = self.tokenizer_map
        if self.coding != IDENTITY:
            headers["Content-Encoding"] = self.coding
        if self.coding == ZSTD and self.zstd_dictionary is not None:
            # MUST on every zstd response and only there (codec-spec.md §4, §5).
            headers["Codec-Zstd-Dict"] = self.zstd_dictionary.record.hash
        return headers


def codec_plan(
    request: web.Request,
    endpoint: Endpoint,
    *,
    upstream_path: str,
    upstream: UpstreamRequest,
    stream_format: str,
    resolve_model: bool = False,
) -> CodecPlan:
    """The plan every Codec entry point builds: encoder from `stream_format` and `Accept`,
    content coding from `Accept-Encoding`.

    Called before any upstream contact, so a 403 (Codec not enabled for this client,
    core/http/access.py), a 426 (version gate, codec-spec.md §6) or a 406 (no acceptable
    coding) never costs the backend anything.
    """
    model = model_of(request)
    live = config_of(request)
    config = live.model(model.name)
    client = admit_codec(request, model)
    encoder = encoder_for(
        stream_format, prefixed_msgpack=wants_prefixed_msgpack(request.headers.get("Accept"))
    )
    dictionary = model.dictionaries.for_format(encoder.stream_format)
    coding = negotiate_coding(
        combined_header(request, "Accept-Encoding"),
        stream_format=encoder.stream_format,
        flush_interval_ms=config.flush_interval_ms,
        flush_frames=config.flush_frames,
        zstd_dictionary=dictionary is not None,
        # Dictionary zstd only for a declared Codec client (core/http/content_coding.py).
        codec_client=declared_client_version(request),
        uncompressed=live.uncompressed(model.name, presented_key(request)),
    )
    return CodecPlan(
        endpoint,
        upstream_path,
        upstream,
        client,
        encoder,
        token_ids=config.token_ids,
        resolve_model=resolve_model,
        tokenizer_map=model.published.header_value,
        coding=coding,
        zstd_dictionary=dictionary if coding == ZSTD else None,
    )


def admit_codec(request: web.Request, model: ServedModel) -> ClientVersion:
    """A Codec request's admission, before any upstream contact: the rollout switches (403)
    and the version gate (426), counted when they refuse. The client's version."""
    request[RECORD].mode = "codec"  # refused or not, a Codec request
    try:
        check_access(request, model)
        return codec_gate(request)
    except ProxyError as exc:
        _refused(request, model.name, exc.code or "refused")
        raise


def _refused(request: web.Request, model: str, reason: str) -> None:
    """A Codec request refused: counted, and its trace told why."""
    request.app[METRICS].codec_refused.labels(model, reason).inc()
    trace = request.get(TRACE)
    if trace is not None:
        trace.refused(reason)


def check_access(request: web.Request, model: ServedModel) -> None:
    """The rollout switches (core/http/access.py): 403 `codec_not_enabled` when this client
    may not have Codec for this model."""
    live = config_of(request)
    header = live.settings.codec_client_header
    live.access.check(
        model=model.name,
        model_enabled=live.model(model.name).codec_enabled,
        key=presented_key(request),
        client=None if header is None else request.headers.get(header),
    )


async def serve_codec(request: web.Request, plan: CodecPlan) -> web.StreamResponse:
    app = request.app
    served = model_of(request)
    # Never stream IDs while a readiness check of this model (the tokenizer drift check, the
    # verification) says they would be wrong; JSON requests do not come here and keep passing.
    refusal = served.readiness.codec_refusal()
    if refusal is not None:
        _refused(request, served.name, refusal.reason)
        raise ServiceUnavailable(
            f"Codec streams are refused for now ({refusal.reason}); JSON requests are served",
            code=refusal.reason,
            retry_after=served.codec_retry_after(time.monotonic()),
        )
    record = request[RECORD]
    record.mode = "codec"
    record.stream_format = plan.encoder.stream_format
    record.encoding = plan.coding
    app[METRICS].codec_requests.labels(
        served.name, plan.encoder.stream_format, client_version_label(request), plan.coding
    ).inc()
    requested = plan.upstream.fields.get("model") if plan.upstream.has_model else None
    model = served.upstream_name(requested)
    if model is None and plan.resolve_model:
        model = await served.listing.default_name()
    context = stream_context(request, "codec")
    async with _open_upstream(request, context, plan, model) as (exchange, asked_for_ids):
        if exchange.status != 200:
            # Before the stream starts the upstream's own error is the best answer.
            return await relay_response(request, context, exchange)
        return await _serve(request, context, plan, exchange, asked_for_ids)


@contextlib.asynccontextmanager
async def _open_upstream(
    request: web.Request, context: StreamContext, plan: CodecPlan, model: str | None
) -> AsyncIterator[tuple[Exchange, bool]]:
    """The upstream exchange, and whether its request asked for token IDs."""
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    ask = plan.token_ids != "retokenize"
    # Asked in the field of the server behind the upstream, once `--backend` or its /v1/models
    # says which (core/backend/kind.py); until then in every backend's.
    served = model_of(request)
    backend = backend_kind(served.config.backend, served.listing.backend_kind())

    def exchange(ask_for_ids: bool) -> contextlib.AbstractAsyncContextManager[Exchange]:
        body = plan.upstream.body(
            model=model,
            ask_for_ids=ask_for_ids,
            backend=backend,
            rename=served.config.upstream_model is not None,
        )
        return served.pool.open(
            context,
            method="POST",
            path_qs=plan.upstream_path,
            headers=headers,
            body=body,
        )

    # Nothing to leave out again when the backend has no field for this request.
    retry = ask and plan.token_ids == "auto" and bool(plan.upstream.id_fields(backend))
    async with exchange(ask) as first:
        status = first.status
        if not (retry and status in _REFUSED):
            yield first, ask
            return
        detail, _ = await first.read_all(_ERROR_BODY_LIMIT)
    # `auto` promises the text either way: an upstream that rejects the added fields is asked
    # again without them, so their names never reach the client in an error either.
    log.info("upstream refused the token-ID fields (%d %s); retokenizing", status, quoted(detail))
    async with exchange(False) as second:
        yield second, False


def _body(request: web.Request, plan: CodecPlan, asked_for_ids: bool) -> tuple[CodecBody, bool]:
    """The stream's body, and whether it was sampled for verification
    (server/models/verification.py)."""
    live = config_of(request)
    settings = live.settings
    served = model_of(request)
    config = live.model(served.name)
    vocabulary = served.vocabulary
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        plan.endpoint.parse_chunk,
        max_event_bytes=settings.max_event_bytes,
        token_ids=plan.token_ids if asked_for_ids else "retokenize",
        token_bytes=vocabulary.token_bytes,
    )
    policy = live.safety_policy(served.name)
    policed = None if policy is None else PolicedIds(policy.rules, vocabulary.loaded.tokenizer)
    # The guard applies the client's finish-reason floor and, when enabled, the policy.
    guard = StreamGuard(transcoder, plan.client, policed)
    configured = FlushConfig(
        config.flush_interval_ms, config.flush_frames, merge=settings.merge_frames
    )
    flush = flush_config_for(plan.coding, configured)
    compressor = new_compressor(plan.coding, plan.zstd_dictionary)
    writer = BodyWriter(plan.encoder, compressor, flush)
    sampled, decoder = served.verification.decoder_for_stream(settings.verify_sample_rate)
    return verified_codec_body(transcoder, guard, writer, decoder), sampled


async def _serve(
    request: web.Request,
    context: StreamContext,
    plan: CodecPlan,
    exchange: Exchange,
    asked_for_ids: bool,
) -> web.StreamResponse:
    app = request.app
    body, sampled = _body(request, plan, asked_for_ids)
    guard = body.guard
    context.record.phase = "first_token"

    def start() -> web.StreamResponse:
        headers = plan.response_headers(guard.token_source or RETOKENIZED)
        policy = config_of(request).safety_policy(model_of(request).name)
        if policy is not None:
            # Withheld from clients below 0.4 by the header floor hook
            # (server/control/versioning.py).
            headers.update(policy.response_headers())
        return StreamedResponse(status=200, headers=headers)

    response, end = await stream_response(
        request, context, exchange, body, start, encoding=plan.coding, timed=True
    )
    _account(request, plan, guard, exchange)
    verdict = body.verification if body.done else None
    trace = context.trace
    if trace is not None:
        trace.codec_stream(
            guard.outcome,
            guard.token_source or RETOKENIZED,
            verdict_label(verdict) if sampled else None,
        )
    if sampled and model_of(request).verification.record(
        verdict,
        token_source=guard.token_source or RETOKENIZED,
        request=context.record.described(),
        settings=config_of(request).settings,
        metrics=app[METRICS],
        now=time.monotonic(),
    ):
        app[SERVED_MODELS].publish_gauges(app[METRICS], app[LIVE].current)
    if guard.stopped is not None:
        # Category names are public (in the descriptor); rule contents never are.
        log.info("safety policy stopped a Codec stream (category %s)", guard.stopped)
    if guard.stopped is None and end is StreamEnd.COMPLETE:
        # Only the usage chunk and [DONE] are left: read them in the background, and the
        # connection is reused.
        exchange.drain_rest()
    else:
        # Cancel, don't drain: closing the connection is what makes the backend stop.
        exchange.cancel()
    return response


def _account(request: web.Request, plan: CodecPlan, guard: StreamGuard, exchange: Exchange) -> None:
    record = request[RECORD]
    metrics = request.app[METRICS]
    model = model_of(request).name
    fmt = plan.encoder.stream_format
    outcome = guard.outcome
    tokens = outcome.tokens if outcome is not None else 0
    record.tokens = tokens
    source = guard.token_source or RETOKENIZED
    metrics.tokens.labels(fmt, model, source).inc(tokens)
    # What the client did not have to download: the upstream's JSON-SSE minus our frames.
    saved = exchange.bytes_in - record.bytes_out
    if saved > 0:
        metrics.bytes_saved.labels(model, fmt).inc(saved)
    if guard.stopped is not None:
        record.outcome = "policy_stop"
    elif outcome is not None and outcome.error and outcome.internal:
        record.outcome = "internal_error"
        log.error("codec stream ended by a fault of the proxy: %s", outcome.error)
    elif outcome is not None and outcome.error:
        record.outcome = record.outcome if record.outcome != "ok" else "upstream_error"
        log.warning("codec stream ended with error: %s", outcome.error)
    if outcome is not None and outcome.retokenized_spans:
        log.info(
            "backend IDs did not account for %d span(s); those were retokenized",
            outcome.retokenized_spans,
        )
