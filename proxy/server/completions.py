"""`POST /v1/completions`: JSON requests pass through untouched; binary ones become Codec."""

from __future__ import annotations

from aiohttp import web

from proxy.core.body_coding import decode_body
from proxy.core.chunks import parse_completion_chunk
from proxy.core.request import CompletionRequest, parse_completion_request
from proxy.core.safety.json_policing import COMPLETION_TEXT, TextField
from proxy.core.transcode import ChunkParser
from proxy.server.codec_stream import codec_plan, combined_header, stream_codec
from proxy.server.json_policy import police_json
from proxy.server.keys import SAFETY_POLICY, SETTINGS, VOCABULARY
from proxy.server.relay import relay, request_target

COMPLETION_FIELDS = (COMPLETION_TEXT, COMPLETION_TEXT)


async def read_body(request: web.Request) -> tuple[bytes, bytes]:
    """The body as sent and decoded, each capped at max_body_bytes (413 beyond it).

    The app reads bodies without aiohttp's decompression (client_max_size caps the raw bytes):
    pass-through sends the body as it was sent, Codec requests are parsed from the decoded one.
    """
    raw = await request.read()
    decoded = decode_body(
        raw,
        combined_header(request, "Content-Encoding"),
        max_bytes=request.app[SETTINGS].max_body_bytes,
    )
    return raw, decoded


async def completions(request: web.Request) -> web.StreamResponse:
    raw, body = await read_body(request)
    vocabulary = request.app[VOCABULARY]
    parsed = parse_completion_request(body, vocab_size=vocabulary.loaded.vocab_size)
    return await answer(request, raw, body, parsed, parse_completion_chunk, COMPLETION_FIELDS)


async def answer(
    request: web.Request,
    raw: bytes,
    body: bytes,
    parsed: CompletionRequest,
    parse_chunk: ChunkParser,
    text_fields: tuple[TextField, TextField],
) -> web.StreamResponse:
    """JSON or Codec, for completions and chat alike (`text_fields`: streamed, whole body)."""
    if not parsed.is_codec:
        # JSON is not Codec traffic: never refused for its version. Passed through byte for
        # byte (coding and all) unless a safety policy must read it.
        if SAFETY_POLICY in request.app:
            return await police_json(request, body, *text_fields)
        return await relay(request, body=raw)
    plan = codec_plan(
        request,
        upstream_path=request_target(request),
        upstream=parsed.upstream(),
        stream_format=parsed.stream_format,
        parse_chunk=parse_chunk,
    )
    return await stream_codec(request, plan)
