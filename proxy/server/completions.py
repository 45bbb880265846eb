"""`POST /v1/completions`: JSON requests pass through untouched; binary ones become Codec."""

from __future__ import annotations

from aiohttp import web

from proxy.core.chunks import parse_completion_chunk
from proxy.core.errors import UnsupportedMediaType
from proxy.core.frames import encoder_for
from proxy.core.negotiation import wants_prefixed_msgpack
from proxy.core.request import parse_completion_request
from proxy.core.safety.json_policing import COMPLETION_TEXT
from proxy.server.codec_stream import CodecPlan, stream_codec
from proxy.server.json_policy import police_json
from proxy.server.keys import SAFETY_POLICY, TOKENIZER_MAP, VOCABULARY
from proxy.server.relay import relay, request_target
from proxy.server.versioning import codec_gate


async def read_body(request: web.Request) -> bytes:
    """The request body, capped by the app's client_max_size (413 beyond it)."""
    coding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise UnsupportedMediaType(f"request Content-Encoding {coding!r} is not supported")
    return await request.read()


async def completions(request: web.Request) -> web.StreamResponse:
    raw = await read_body(request)
    vocabulary = request.app[VOCABULARY]
    parsed = parse_completion_request(raw, vocab_size=vocabulary.loaded.vocab_size)
    if not parsed.is_codec:
        # JSON is not Codec traffic: never refused for its version. Passed through byte for
        # byte unless a safety policy must read it.
        if SAFETY_POLICY in request.app:
            return await police_json(request, raw, COMPLETION_TEXT, COMPLETION_TEXT)
        return await relay(request, body=raw)
    codec_gate(request)  # 426 before any upstream contact
    encoder = encoder_for(
        parsed.stream_format,
        prefixed_msgpack=wants_prefixed_msgpack(request.headers.get("Accept")),
    )
    plan = CodecPlan(
        upstream_path=request_target(request),
        upstream_body=parsed.upstream_body(),
        encoder=encoder,
        parse_chunk=parse_completion_chunk,
        tokenizer_map=request.app[TOKENIZER_MAP].header_value,
    )
    return await stream_codec(request, plan)
