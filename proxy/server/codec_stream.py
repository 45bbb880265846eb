"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

Every Codec entry point (Path A `/v1/completions`, Path B `/v1/completions/codec`, chat) builds a
`CodecPlan` with `codec_plan` and calls `stream_codec`. The bytes are pumped through the sans-IO
`CodecTranscoder` (wrapped by the `StreamGuard`, which applies the client's finish-reason floor
and the safety policy); this module only does the IO around it: the upstream request, the
response headers, awaited writes (so a slow client applies backpressure all the way to the
upstream), and closing the upstream when the stream ends.

The response starts once the first frame is ready and the token source is known. Until then
nothing has reached the client, so a timeout or an upstream failure is still a clean HTTP error
(504/502); after it, every failure becomes the one terminal error frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.core.compressors import StreamCompressor, new_compressor
from proxy.core.content_coding import IDENTITY, ZSTD, ContentCoding, negotiate_coding
from proxy.core.dictionaries import LoadedZstdDictionary
from proxy.core.errors import ProxyError, ServiceUnavailable, UpstreamTimeout, UpstreamUnavailable
from proxy.core.flush import FlushConfig
from proxy.core.frames import Frame, FrameEncoder, encoder_for
from proxy.core.guard import StreamGuard
from proxy.core.negotiation import wants_prefixed_msgpack
from proxy.core.safety.stream import PolicedIds
from proxy.core.token_source import RETOKENIZED, TokenIdMode
from proxy.core.transcode import ChunkParser, CodecTranscoder
from proxy.core.upstream_body import UpstreamRequest
from proxy.core.versioning import allows_header
from proxy.server.client_writer import ClientWriter
from proxy.server.compressing_sink import CompressingFrameSink
from proxy.server.frame_sink import DirectFrameSink, FrameSink
from proxy.server.keys import (
    LIFECYCLE,
    METRICS,
    MODEL,
    READINESS,
    SAFETY_POLICY,
    SETTINGS,
    TOKENIZER_MAP,
    UPSTREAM,
    VOCABULARY,
    ZSTD_DICTIONARIES,
)
from proxy.server.lifecycle import is_shutdown
from proxy.server.model import MODELS_PATH
from proxy.server.observe import RECORD
from proxy.server.relay import forward_headers, relay_response
from proxy.server.upstream import Exchange
from proxy.server.versioning import client_version, codec_gate

log = logging.getLogger("codec_proxy")

# The client's content negotiation is about the Codec response, not the upstream's SSE: the
# upstream must send plain, uncompressed SSE that we can parse.
_UPSTREAM_DROP = ("accept", "accept-encoding", "content-type", "content-encoding")
_UPSTREAM_ADD = [
    ("Accept", "text/event-stream"),
    ("Accept-Encoding", "identity"),
    ("Content-Type", "application/json"),
]
# After the terminal frame the upstream has only its usage chunk and [DONE] left; reading them
# lets the pooled connection be reused instead of closed. The client's kept-alive connection
# waits for this (the handler has not returned yet), so the wait is short: backends send them
# right after the final chunk, and past that a new upstream connection is the cheaper loss.
_DRAIN_LIMIT_BYTES = 64 * 1024
_DRAIN_SECONDS = 0.1
# An upstream that refuses the token-ID fields we added (auto mode) is asked again without.
_REFUSED = frozenset({400, 422})
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True)
class CodecPlan:
    """Everything decided about a Codec response before the upstream is contacted."""

    upstream_path: str
    upstream: UpstreamRequest
    encoder: FrameEncoder
    parse_chunk: ChunkParser
    # Where the frames' IDs come from (core/token_source.py).
    token_ids: TokenIdMode = "retokenize"
    # Path B: CodecRequest names no model; use --model or the upstream's only one.
    resolve_model: bool = False
    # `Codec-Tokenizer-Map: <id> sha256:<64 hex>` of the map the IDs follow (floor v0.2).
    tokenizer_map: str | None = None
    # Negotiated from Accept-Encoding (core/content_coding.py); zstd carries its dictionary.
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
            # `backend` (the model's sampled IDs) or `retokenized` (core/token_source.py).
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

    def new_compressor(self) -> StreamCompressor:
        return new_compressor(self.coding, self.zstd_dictionary)


def codec_plan(
    request: web.Request,
    *,
    upstream_path: str,
    upstream: UpstreamRequest,
    stream_format: str,
    parse_chunk: ChunkParser,
    resolve_model: bool = False,
) -> CodecPlan:
    """The plan every Codec entry point builds: encoder from `stream_format` and `Accept`,
    content coding from `Accept-Encoding`.

    Called before any upstream contact, so a 426 (version gate, codec-spec.md §6) or a 406 (no
    acceptable coding) never costs the backend anything.
    """
    version = codec_gate(request)
    encoder = encoder_for(
        stream_format, prefixed_msgpack=wants_prefixed_msgpack(request.headers.get("Accept"))
    )
    dictionary = request.app[ZSTD_DICTIONARIES].for_format(encoder.stream_format)
    coding = negotiate_coding(
        combined_header(request, "Accept-Encoding"),
        zstd_dictionary=dictionary is not None,
        # zstd responses must carry Codec-Zstd-Dict: only for clients allowed that header.
        allow_zstd=allows_header(version, "Codec-Zstd-Dict"),
    )
    return CodecPlan(
        upstream_path,
        upstream,
        encoder,
        parse_chunk,
        token_ids=request.app[SETTINGS].token_ids,
        resolve_model=resolve_model,
        tokenizer_map=request.app[TOKENIZER_MAP].header_value,
        coding=coding,
        zstd_dictionary=dictionary if coding == ZSTD else None,
    )


def combined_header(request: web.Request, name: str) -> str | None:
    """A list-valued field sent as several lines is one comma-joined list (RFC 9110 §5.3)."""
    values = request.headers.getall(name, [])
    return ", ".join(values) if values else None


async def stream_codec(request: web.Request, plan: CodecPlan) -> web.StreamResponse:
    app = request.app
    # Never stream IDs while a readiness check (the tokenizer drift check) says they would be
    # wrong; JSON requests do not come here and keep passing through.
    refusal = app[READINESS].codec_refusal()
    if refusal is not None:
        raise ServiceUnavailable(refusal.detail, code=refusal.reason)
    record = request[RECORD]
    record.mode = "codec"
    record.stream_format = plan.encoder.stream_format
    record.phase = "upstream_headers"
    model = app[SETTINGS].model
    if plan.resolve_model:
        model = await app[MODEL].name(lambda: _list_models(request))
    active = app[METRICS].active_streams.labels("codec")
    active.inc()
    try:
        with app[LIFECYCLE].tracking():
            async with _open_upstream(request, plan, model) as (exchange, asked_for_ids):
                record.upstream = exchange.upstream.url
                if exchange.response.status != 200:
                    # Before the stream starts the upstream's own error is the best answer.
                    return await relay_response(request, exchange)
                try:
                    return await _serve(request, plan, exchange, asked_for_ids)
                finally:
                    # Also when the client hangs up while the rest of the body is drained.
                    record.bytes_in = exchange.bytes_in
    finally:
        active.dec()


@contextlib.asynccontextmanager
async def _open_upstream(
    request: web.Request, plan: CodecPlan, model: str | None
) -> AsyncIterator[tuple[Exchange, bool]]:
    """The upstream exchange, and whether its request asked for token IDs."""
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    ask = plan.token_ids != "retokenize"
    pool = request.app[UPSTREAM]
    body = plan.upstream.body(model=model, ask_for_ids=ask)
    async with pool.open("POST", plan.upstream_path, headers=headers, data=body) as exchange:
        status = exchange.response.status
        if not (ask and plan.token_ids == "auto" and status in _REFUSED):
            yield exchange, ask
            return
        detail = await exchange.response.content.read(_ERROR_BODY_LIMIT)
    # `auto` promises the text either way: an upstream that rejects the added fields is asked
    # again without them, so their names never reach the client in an error either.
    log.info("upstream refused the token-ID fields (%d %r); retokenizing", status, detail[:200])
    body = plan.upstream.body(model=model, ask_for_ids=False)
    async with pool.open("POST", plan.upstream_path, headers=headers, data=body) as exchange:
        yield exchange, False


async def _list_models(request: web.Request) -> tuple[int, bytes]:
    headers = [("Accept", "application/json"), ("Accept-Encoding", "identity")]
    try:
        async with request.app[UPSTREAM].request(
            "GET", MODELS_PATH, headers=headers, data=None
        ) as resp:
            return resp.status, await resp.content.read(_ERROR_BODY_LIMIT * 16)
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(f"GET {MODELS_PATH} failed: {exc}") from exc


def _guard(request: web.Request, plan: CodecPlan, asked_for_ids: bool) -> StreamGuard:
    app = request.app
    vocabulary = app[VOCABULARY]
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        plan.parse_chunk,
        max_event_bytes=app[SETTINGS].max_event_bytes,
        token_ids=plan.token_ids if asked_for_ids else "retokenize",
        token_bytes=vocabulary.token_bytes,
    )
    policy = app.get(SAFETY_POLICY)
    policed = None if policy is None else PolicedIds(policy.rules, vocabulary.loaded.tokenizer)
    # The guard applies the client's finish-reason floor and, when enabled, the policy.
    return StreamGuard(transcoder, client_version(request), policed)


async def _serve(
    request: web.Request, plan: CodecPlan, exchange: Exchange, asked_for_ids: bool
) -> web.StreamResponse:
    app = request.app
    record = request[RECORD]
    metrics = app[METRICS]
    guard = _guard(request, plan, asked_for_ids)
    chunks = exchange.chunks().__aiter__()
    overhead = metrics.overhead.labels("codec")

    async def next_frames() -> list[Frame]:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return guard.end_of_upstream()
        started = time.perf_counter()
        frames = guard.feed(chunk)
        overhead.observe(time.perf_counter() - started)
        return frames

    record.phase = "first_token"
    # `Codec-Token-Source` is a header, and `auto` knows the source only from the first chunk
    # with output: read until then (no frame could have gone out earlier anyway).
    frames: list[Frame] = []
    while not guard.done and (not frames or guard.token_source is None):
        try:
            frames += await next_frames()
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(f"upstream failed before the first token: {exc}") from exc
    headers = plan.response_headers(guard.token_source or RETOKENIZED)
    policy = app.get(SAFETY_POLICY)
    if policy is not None:
        # Withheld from clients below 0.4 by the header floor hook (server/versioning.py).
        headers.update(policy.response_headers())
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    sink = _sink(request, response, plan)
    record.phase = "streaming"
    try:
        await _pump(guard, sink, frames, next_frames, request)
        await sink.close()
    finally:
        sink.abort()  # no flush timer outlives the stream, however it ended
    _account(request, plan, guard)
    if guard.stopped is not None:
        # Category names are public (in the descriptor); rule contents never are.
        log.info("safety policy stopped a Codec stream (category %s)", guard.stopped)
        # Cancel, don't drain: closing the connection is what makes the backend stop.
        exchange.response.close()
    else:
        await _drain(exchange.response)
    return response


async def _pump(
    guard: StreamGuard,
    sink: FrameSink,
    first: list[Frame],
    next_frames: Callable[[], Awaitable[list[Frame]]],
    request: web.Request,
) -> None:
    """Frames to the client until the terminal one; exactly one terminal frame, always."""
    metrics = request.app[METRICS]
    try:
        await sink.write(first)
        while not guard.done:
            # Only upstream reads are guarded: a failed write means the client left, and that
            # must propagate so the upstream request is closed and the backend stops.
            try:
                frames = await next_frames()
            except (aiohttp.ClientError, ProxyError) as exc:
                if isinstance(exc, UpstreamTimeout):
                    metrics.timeouts.labels("idle").inc()
                frames = guard.fail(f"upstream failed mid-stream: {exc}")
            await sink.write(frames)
    except asyncio.CancelledError as exc:
        if not is_shutdown(exc):
            raise
        # The drain timeout ran out: end the stream properly, then finish normally.
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        request[RECORD].outcome = "ended_by_shutdown"
        await sink.write(guard.fail("proxy shutting down"))


def _sink(request: web.Request, response: web.StreamResponse, plan: CodecPlan) -> FrameSink:
    settings = request.app[SETTINGS]
    writer = ClientWriter(
        request,
        response,
        metrics=request.app[METRICS],
        record=request[RECORD],
        write_timeout=settings.write_timeout,
        encoding=plan.coding,
    )
    if plan.coding == IDENTITY:
        return DirectFrameSink(writer, plan.encoder)
    flush = FlushConfig(
        settings.flush_interval_ms, settings.flush_frames, merge=settings.merge_frames
    )
    return CompressingFrameSink(writer, plan.encoder, plan.new_compressor(), flush)


def _account(request: web.Request, plan: CodecPlan, guard: StreamGuard) -> None:
    record = request[RECORD]
    outcome = guard.outcome
    tokens = outcome.tokens if outcome is not None else 0
    record.tokens = tokens
    request.app[METRICS].tokens.labels(plan.encoder.stream_format).inc(tokens)
    if guard.stopped is not None:
        record.outcome = "policy_stop"
    elif outcome is not None and outcome.error:
        record.outcome = record.outcome if record.outcome != "ok" else "upstream_error"
        log.warning("codec stream ended with error: %s", outcome.error)
    if outcome is not None and outcome.retokenized_spans:
        log.info(
            "backend IDs did not account for %d span(s); those were retokenized",
            outcome.retokenized_spans,
        )


async def _drain(upstream: aiohttp.ClientResponse) -> None:
    async def read_rest() -> None:
        seen = 0
        async for chunk in upstream.content.iter_any():
            seen += len(chunk)
            if seen > _DRAIN_LIMIT_BYTES:
                return

    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(read_rest(), _DRAIN_SECONDS)
