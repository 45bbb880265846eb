"""`POST /v1/completions`: JSON requests pass through untouched; binary ones become Codec."""

from __future__ import annotations

from aiohttp import web

from proxy.core.chunks import parse_completion_chunk
from proxy.core.errors import UnsupportedMediaType
from proxy.core.request import parse_completion_request
from proxy.core.safety.json_policing import COMPLETION_TEXT
from proxy.server.codec_stream import codec_plan, stream_codec
from proxy.server.json_policy import police_json
from proxy.server.keys import SAFETY_POLICY, VOCABULARY
from proxy.server.relay import relay, request_target


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
    plan = codec_plan(
        request,
        upstream_path=request_target(request),
        upstream=parsed.upstream(),
        stream_format=parsed.stream_format,
        parse_chunk=parse_completion_chunk,
    )
    return await stream_codec(request, plan)
