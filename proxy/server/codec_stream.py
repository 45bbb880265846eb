"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

The bytes are pumped through the sans-IO `CodecTranscoder`; this module only does the IO around
it: the upstream request, the response headers, awaited writes (so a slow client applies
backpressure all the way to the upstream), and closing the upstream when the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web

from proxy.core.frames import Frame, FrameEncoder
from proxy.core.transcode import ChunkParser, CodecTranscoder
from proxy.server.keys import SETTINGS, UPSTREAM, VOCABULARY
from proxy.server.relay import forward_headers, relay_response, upstream_call

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


def codec_headers(encoder: FrameEncoder) -> dict[str, str]:
    return {
        "Content-Type": encoder.content_type,
        # Intermediaries must neither cache nor buffer a token stream (peers.md must-have 3).
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        # The body depends on both (v0.6-wire §2.2: Codec-Client-Version, or caches poison).
        "Vary": "Accept-Encoding, Codec-Client-Version",
    }


async def stream_codec(
    request: web.Request,
    *,
    path: str,
    body: bytes,
    encoder: FrameEncoder,
    parse_chunk: ChunkParser,
) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    async with upstream_call(
        request.app[UPSTREAM], "POST", path, headers=headers, data=body
    ) as upstream:
        if upstream.status != 200:
            # Before the stream starts the upstream's own error is the best answer: pass it on.
            return await relay_response(request, upstream)
        response = web.StreamResponse(status=200, headers=codec_headers(encoder))
        await response.prepare(request)
        transcoder = CodecTranscoder(
            request.app[VOCABULARY].scheme, parse_chunk, max_event_bytes=settings.max_event_bytes
        )
        await _pump(upstream, transcoder, response, encoder)
        await response.write_eof()
        outcome = transcoder.outcome
        if outcome is not None and outcome.error:
            log.warning("codec stream ended with error: %s", outcome.error)
        await _drain(upstream)
    return response


async def _pump(
    upstream: aiohttp.ClientResponse,
    transcoder: CodecTranscoder,
    response: web.StreamResponse,
    encoder: FrameEncoder,
) -> None:
    # Only upstream reads are guarded: a failed write means the client left, and that must
    # propagate so the upstream request is closed and the backend stops generating.
    chunks = upstream.content.iter_any().__aiter__()
    while not transcoder.done:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            await _write(response, encoder, transcoder.end_of_upstream())
            return
        except (TimeoutError, aiohttp.ClientError) as exc:
            await _write(response, encoder, transcoder.fail(f"upstream failed mid-stream: {exc!r}"))
            return
        await _write(response, encoder, transcoder.feed(chunk))


async def _write(response: web.StreamResponse, encoder: FrameEncoder, frames: list[Frame]) -> None:
    if frames:
        await response.write(b"".join([encoder.encode(frame) for frame in frames]))


async def _drain(upstream: aiohttp.ClientResponse) -> None:
    async def read_rest() -> None:
        seen = 0
        async for chunk in upstream.content.iter_any():
            seen += len(chunk)
            if seen > _DRAIN_LIMIT_BYTES:
                return

    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(read_rest(), _DRAIN_SECONDS)
