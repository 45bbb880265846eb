"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

The bytes are pumped through the sans-IO `CodecTranscoder` (wrapped by the `StreamGuard`, which
applies the client's finish-reason floor and the safety policy); this module only does the IO
around it: the upstream request, the response headers, awaited writes (so a slow client applies
backpressure all the way to the upstream), and closing the upstream when the stream ends.

The response starts with the first frame. Until then nothing has reached the client, so a
timeout or an upstream failure is still a clean HTTP error (504/502); after it, every failure
becomes the one terminal error frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.core.errors import ProxyError, ServiceUnavailable, UpstreamTimeout, UpstreamUnavailable
from proxy.core.frames import Frame, FrameEncoder
from proxy.core.guard import StreamGuard
from proxy.core.safety.stream import PolicedIds
from proxy.core.transcode import ChunkParser, CodecTranscoder
from proxy.server.client_writer import ClientWriter
from proxy.server.frame_sink import DirectFrameSink
from proxy.server.keys import (
    LIFECYCLE,
    METRICS,
    READINESS,
    SAFETY_POLICY,
    SETTINGS,
    UPSTREAM,
    VOCABULARY,
)
from proxy.server.lifecycle import is_shutdown
from proxy.server.observe import RECORD
from proxy.server.relay import forward_headers, relay_response
from proxy.server.upstream import Exchange
from proxy.server.versioning import client_version

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
# lets the pooled connection be reused instead of closed.
_DRAIN_LIMIT_BYTES = 64 * 1024
_DRAIN_SECONDS = 1.0


@dataclass(frozen=True)
class CodecPlan:
    """Everything decided about a Codec response before the upstream is contacted."""

    upstream_path: str
    upstream_body: bytes
    encoder: FrameEncoder
    parse_chunk: ChunkParser
    # `Codec-Tokenizer-Map: <id> sha256:<64 hex>` of the map the IDs follow (floor v0.2).
    tokenizer_map: str | None = None

    def response_headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": self.encoder.content_type,
            # Intermediaries must neither cache nor buffer a token stream (peers.md must-have 3).
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            # The body depends on both (v0.6-wire §2.2: Codec-Client-Version, or caches poison).
            "Vary": "Accept-Encoding, Codec-Client-Version",
        }
        if self.tokenizer_map is not None:
            headers["Codec-Tokenizer-Map"] = self.tokenizer_map
        return headers


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
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    active = app[METRICS].active_streams.labels("codec")
    active.inc()
    try:
        with app[LIFECYCLE].tracking():
            async with app[UPSTREAM].open(
                "POST", plan.upstream_path, headers=headers, data=plan.upstream_body
            ) as exchange:
                record.upstream = exchange.upstream.url
                if exchange.response.status != 200:
                    # Before the stream starts the upstream's own error is the best answer.
                    return await relay_response(request, exchange)
                try:
                    return await _serve(request, plan, exchange)
                finally:
                    # Also when the client hangs up while the rest of the body is drained.
                    record.bytes_in = exchange.bytes_in
    finally:
        active.dec()


def _guard(request: web.Request, plan: CodecPlan) -> StreamGuard:
    app = request.app
    vocabulary = app[VOCABULARY]
    transcoder = CodecTranscoder(
        vocabulary.scheme, plan.parse_chunk, max_event_bytes=app[SETTINGS].max_event_bytes
    )
    policy = app.get(SAFETY_POLICY)
    policed = None if policy is None else PolicedIds(policy.rules, vocabulary.loaded.tokenizer)
    # The guard applies the client's finish-reason floor and, when enabled, the policy.
    return StreamGuard(transcoder, client_version(request), policed)


async def _serve(request: web.Request, plan: CodecPlan, exchange: Exchange) -> web.StreamResponse:
    app = request.app
    record = request[RECORD]
    metrics = app[METRICS]
    guard = _guard(request, plan)
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
    frames: list[Frame] = []
    while not frames:
        try:
            frames = await next_frames()
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(f"upstream failed before the first token: {exc}") from exc
    headers = plan.response_headers()
    policy = app.get(SAFETY_POLICY)
    if policy is not None:
        # Withheld from clients below 0.4 by the header floor hook (server/versioning.py).
        headers.update(policy.response_headers())
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    writer = ClientWriter(
        request, response, metrics=metrics, record=record, write_timeout=app[SETTINGS].write_timeout
    )
    sink = DirectFrameSink(writer, plan.encoder)
    record.phase = "streaming"
    try:
        await sink.write(frames)
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
        record.outcome = "ended_by_shutdown"
        await sink.write(guard.fail("proxy shutting down"))
    await sink.close()
    _account(request, plan, guard)
    if guard.stopped is not None:
        # Category names are public (in the descriptor); rule contents never are.
        log.info("safety policy stopped a Codec stream (category %s)", guard.stopped)
        # Cancel, don't drain: closing the connection is what makes the backend stop.
        exchange.response.close()
    else:
        await _drain(exchange.response)
    return response


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


async def _drain(upstream: aiohttp.ClientResponse) -> None:
    async def read_rest() -> None:
        seen = 0
        async for chunk in upstream.content.iter_any():
            seen += len(chunk)
            if seen > _DRAIN_LIMIT_BYTES:
                return

    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(read_rest(), _DRAIN_SECONDS)
