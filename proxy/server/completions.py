"""`POST /v1/completions`: JSON requests pass through untouched; binary ones become Codec."""

from __future__ import annotations

from aiohttp import web

from proxy.core.body_coding import decode_body
from proxy.core.chunks import parse_completion_chunk
from proxy.core.content_coding import ZSTD, negotiate_coding
from proxy.core.frames import encoder_for
from proxy.core.negotiation import wants_prefixed_msgpack
from proxy.core.request import parse_completion_request
from proxy.server.codec_stream import CodecPlan, stream_codec
from proxy.server.keys import SETTINGS, VOCABULARY, ZSTD_DICTIONARIES
from proxy.server.relay import relay, request_target


async def read_body(request: web.Request) -> bytes:
    """The request body with its content coding removed, capped (413 beyond the limit)."""
    return (await read_body_as_sent_and_decoded(request))[1]


async def read_body_as_sent_and_decoded(request: web.Request) -> tuple[bytes, bytes]:
    """The body as sent and decoded: each capped at max_body_bytes (413 beyond it)."""
    # The app reads bodies without aiohttp's decompression; client_max_size caps the raw bytes.
    raw = await request.read()
    decoded = decode_body(
        raw,
        _combined(request, "Content-Encoding"),
        max_bytes=request.app[SETTINGS].max_body_bytes,
    )
    return raw, decoded


def _combined(request: web.Request, name: str) -> str | None:
    """A list-valued field sent as several lines is one comma-joined list (RFC 9110 §5.3)."""
    values = request.headers.getall(name, [])
    return ", ".join(values) if values else None


async def completions(request: web.Request) -> web.StreamResponse:
    raw, body = await read_body_as_sent_and_decoded(request)
    vocabulary = request.app[VOCABULARY]
    parsed = parse_completion_request(body, vocab_size=vocabulary.loaded.vocab_size)
    if not parsed.is_codec:
        # Byte for byte: the upstream gets the body as it was sent, coding and all.
        return await relay(request, body=raw)
    encoder = encoder_for(
        parsed.stream_format,
        prefixed_msgpack=wants_prefixed_msgpack(request.headers.get("Accept")),
    )
    dictionary = request.app[ZSTD_DICTIONARIES].for_format(encoder.stream_format)
    coding = negotiate_coding(
        _combined(request, "Accept-Encoding"),
        zstd_dictionary=dictionary is not None,
        # Clients below Codec 0.2 must not get zstd (they may not receive Codec-Zstd-Dict,
        # codec-spec.md §4); version negotiation narrows this, every other client may.
        allow_zstd=True,
    )
    plan = CodecPlan(
        upstream_path=request_target(request),
        upstream_body=parsed.upstream_body(),
        encoder=encoder,
        parse_chunk=parse_completion_chunk,
        coding=coding,
        zstd_dictionary=dictionary if coding == ZSTD else None,
    )
    return await stream_codec(request, plan)
