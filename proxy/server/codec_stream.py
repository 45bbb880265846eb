"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

The bytes are pumped through the sans-IO `CodecTranscoder`; this module only does the IO around
it: the upstream request, the response headers, awaited writes (so a slow client applies
backpressure all the way to the upstream), and closing the upstream when the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.core.errors import ServiceUnavailable
from proxy.core.frames import FrameEncoder
from proxy.core.guard import FrameSource, StreamGuard
from proxy.core.safety.stream import PolicedIds
from proxy.core.transcode import ChunkParser, CodecTranscoder
from proxy.server.frame_sink import DirectFrameSink, FrameSink
from proxy.server.keys import READINESS, SAFETY_POLICY, SETTINGS, UPSTREAM, VOCABULARY
from proxy.server.relay import forward_headers, relay_response, upstream_call
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
    # Never stream IDs while a readiness check (the tokenizer drift check) says they would be
    # wrong; JSON requests do not come here and keep passing through.
    refusal = request.app[READINESS].codec_refusal()
    if refusal is not None:
        raise ServiceUnavailable(refusal.detail, code=refusal.reason)
    settings = request.app[SETTINGS]
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    async with upstream_call(
        request.app[UPSTREAM], "POST", plan.upstream_path, headers=headers, data=plan.upstream_body
    ) as upstream:
        if upstream.status != 200:
            # Before the stream starts the upstream's own error is the best answer: pass it on.
            return await relay_response(request, upstream)
        policy = request.app.get(SAFETY_POLICY)
        response_headers = plan.response_headers()
        if policy is not None:
            # Withheld from clients below 0.4 by the header floor hook (server/versioning.py).
            response_headers.update(policy.response_headers())
        response = web.StreamResponse(status=200, headers=response_headers)
        await response.prepare(request)
        vocabulary = request.app[VOCABULARY]
        transcoder = CodecTranscoder(
            vocabulary.scheme,
            plan.parse_chunk,
            max_event_bytes=settings.max_event_bytes,
        )
        # The guard applies the client's finish-reason floor and, when enabled, the policy.
        policed = None if policy is None else PolicedIds(policy.rules, vocabulary.loaded.tokenizer)
        guard = StreamGuard(transcoder, client_version(request), policed)
        sink = DirectFrameSink(response, plan.encoder)
        await _pump(upstream, guard, sink)
        await sink.close()
        outcome = guard.outcome
        if outcome is not None and outcome.error:
            log.warning("codec stream ended with error: %s", outcome.error)
        if guard.stopped is not None:
            # Category names are public (in the descriptor); rule contents never are.
            log.info("safety policy stopped a Codec stream (category %s)", guard.stopped)
            # Cancel, don't drain: closing the connection is what makes the backend stop.
            upstream.close()
        else:
            await _drain(upstream)
    return response


async def _pump(upstream: aiohttp.ClientResponse, transcoder: FrameSource, sink: FrameSink) -> None:
    # Only upstream reads are guarded: a failed write means the client left, and that must
    # propagate so the upstream request is closed and the backend stops generating.
    chunks = upstream.content.iter_any().__aiter__()
    while not transcoder.done:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            await sink.write(transcoder.end_of_upstream())
            return
        except (aiohttp.ClientError, TimeoutError) as exc:
            await sink.write(transcoder.fail(f"upstream failed mid-stream: {exc!r}"))
            return
        await sink.write(transcoder.feed(chunk))


async def _drain(upstream: aiohttp.ClientResponse) -> None:
    async def read_rest() -> None:
        seen = 0
        async for chunk in upstream.content.iter_any():
            seen += len(chunk)
            if seen > _DRAIN_LIMIT_BYTES:
                return

    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(read_rest(), _DRAIN_SECONDS)
