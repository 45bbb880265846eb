"""Serve one Codec stream: an upstream JSON-SSE response re-framed as Codec frames.

Every Codec entry point (Path A `/v1/completions`, Path B `/v1/completions/codec`, chat) builds a
`CodecPlan` and calls `stream_codec`. The bytes are pumped through the sans-IO
`CodecTranscoder`; this module only does the IO around it: the upstream request, the response
headers, awaited writes (so a slow client applies backpressure all the way to the upstream),
and closing the upstream when the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.core.frames import Frame, FrameEncoder, encoder_for
from proxy.core.negotiation import wants_prefixed_msgpack
from proxy.core.token_source import TokenIdMode
from proxy.core.transcode import ChunkParser, CodecTranscoder
from proxy.core.upstream_body import UpstreamRequest
from proxy.server.frame_sink import DirectFrameSink
from proxy.server.keys import MODEL, SETTINGS, UPSTREAM, VOCABULARY
from proxy.server.model import MODELS_PATH
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

    def response_headers(self, token_source: str) -> dict[str, str]:
        return {
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


def codec_plan(
    request: web.Request,
    *,
    upstream_path: str,
    upstream: UpstreamRequest,
    stream_format: str,
    parse_chunk: ChunkParser,
    resolve_model: bool = False,
) -> CodecPlan:
    """The plan every Codec entry point builds: encoder from `stream_format` and `Accept`."""
    encoder = encoder_for(
        stream_format, prefixed_msgpack=wants_prefixed_msgpack(request.headers.get("Accept"))
    )
    return CodecPlan(
        upstream_path,
        upstream,
        encoder,
        parse_chunk,
        request.app[SETTINGS].token_ids,
        resolve_model,
    )


async def stream_codec(request: web.Request, plan: CodecPlan) -> web.StreamResponse:
    # Checks that refuse a request outright belong before this point: what follows contacts
    # the upstream (the model lookup included).
    settings = request.app[SETTINGS]
    model = settings.model
    if plan.resolve_model:
        model = await request.app[MODEL].name(lambda: _list_models(request))
    async with _upstream_stream(request, plan, model) as (upstream, asked_for_ids):
        if upstream.status != 200:
            # Before the stream starts the upstream's own error is the best answer: pass it on.
            return await relay_response(request, upstream)
        vocabulary = request.app[VOCABULARY]
        transcoder = CodecTranscoder(
            vocabulary.scheme,
            plan.parse_chunk,
            max_event_bytes=settings.max_event_bytes,
            token_ids=plan.token_ids if asked_for_ids else "retokenize",
            token_bytes=vocabulary.token_bytes,
        )
        chunks = upstream.content.iter_any().__aiter__()
        # `Codec-Token-Source` is a header, and `auto` knows the source only from the first
        # chunk with output: read until then (no frame could have gone out earlier anyway).
        first: list[Frame] = []
        while transcoder.token_source is None and not transcoder.done:
            first += await _step(chunks, transcoder)
        source = transcoder.token_source or "retokenized"
        response = web.StreamResponse(status=200, headers=plan.response_headers(source))
        await response.prepare(request)
        sink = DirectFrameSink(response, plan.encoder)
        await sink.write(first)
        while not transcoder.done:
            await sink.write(await _step(chunks, transcoder))
        await sink.close()
        outcome = transcoder.outcome
        if outcome is not None and outcome.error:
            log.warning("codec stream ended with error: %s", outcome.error)
        if outcome is not None and outcome.retokenized_spans:
            log.info(
                "backend IDs did not account for %d span(s); those were retokenized",
                outcome.retokenized_spans,
            )
        await _drain(upstream)
    return response


@asynccontextmanager
async def _upstream_stream(
    request: web.Request, plan: CodecPlan, model: str | None
) -> AsyncIterator[tuple[aiohttp.ClientResponse, bool]]:
    """The upstream response, and whether its request asked for token IDs."""
    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    ask = plan.token_ids != "retokenize"
    upstream = request.app[UPSTREAM]
    body = plan.upstream.body(model=model, ask_for_ids=ask)
    async with upstream_call(upstream, "POST", plan.upstream_path, headers=headers, data=body) as r:
        if not (ask and plan.token_ids == "auto" and r.status in _REFUSED):
            yield r, ask
            return
        detail = await r.content.read(_ERROR_BODY_LIMIT)
    # `auto` promises the text either way: an upstream that rejects the added fields is asked
    # again without them, so their names never reach the client in an error either.
    log.info("upstream refused the token-ID fields (%d %r); retokenizing", r.status, detail[:200])
    body = plan.upstream.body(model=model, ask_for_ids=False)
    async with upstream_call(upstream, "POST", plan.upstream_path, headers=headers, data=body) as r:
        yield r, False


async def _list_models(request: web.Request) -> tuple[int, bytes]:
    headers = [("Accept", "application/json"), ("Accept-Encoding", "identity")]
    upstream = request.app[UPSTREAM]
    async with upstream_call(upstream, "GET", MODELS_PATH, headers=headers, data=None) as resp:
        return resp.status, await resp.content.read(_ERROR_BODY_LIMIT * 16)


async def _step(chunks: AsyncIterator[bytes], transcoder: CodecTranscoder) -> list[Frame]:
    """One upstream read through the transcoder.

    Only upstream reads are guarded: a failed write means the client left, and that must
    propagate so the upstream request is closed and the backend stops generating.
    """
    try:
        chunk = await chunks.__anext__()
    except StopAsyncIteration:
        return transcoder.end_of_upstream()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return transcoder.fail(f"upstream failed mid-stream: {exc!r}")
    return transcoder.feed(chunk)


async def _drain(upstream: aiohttp.ClientResponse) -> None:
    async def read_rest() -> None:
        seen = 0
        async for chunk in upstream.content.iter_any():
            seen += len(chunk)
            if seen > _DRAIN_LIMIT_BYTES:
                return

    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(read_rest(), _DRAIN_SECONDS)
