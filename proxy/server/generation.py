"""The routes that generate text: JSON passes through, a binary `stream_format` becomes Codec.

* `POST /v1/completions` and `POST /v1/chat/completions` (Path A): JSON requests pass through
  byte for byte (policed when a safety policy is on); a binary `stream_format` is served as
  Codec frames of the generated tokens. Chat keeps its template on the backend, so roles never
  reach the wire; tool calls ride on the frames (codec-spec.md §3.2, §12 item 37).
* `POST /v1/completions/codec` (Path B, codec-spec.md §3.3): a binary `CodecRequest`; its
  `prompt_ids` go to the backend's `/v1/completions` as a token-ID prompt, never detokenized
  (§9), and the same frames come back.

What differs between completions and chat is one row of `proxy.core.endpoints`.
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.endpoints import CHAT, COMPLETIONS, Endpoint
from proxy.core.http.body_coding import decode_body
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.wire.codec_request import decode_codec_request
from proxy.server.codec import codec_plan, serve_codec
from proxy.server.keys import SAFETY_POLICY, SETTINGS, VOCABULARY
from proxy.server.policed_json import police_json
from proxy.server.relay import relay
from proxy.server.request_body import read_request_body
from proxy.server.streaming import combined_header, request_target


async def read_body(request: web.Request) -> tuple[bytes, bytes]:
    """The body as sent and decoded, each capped at max_body_bytes (413 beyond it).

    The app reads bodies without aiohttp's decompression (client_max_size caps the raw bytes):
    pass-through sends the body as it was sent, Codec requests are parsed from the decoded one.
    The body must arrive within request_timeout (408).
    """
    raw = await read_request_body(request)
    decoded = decode_body(
        raw,
        combined_header(request, "Content-Encoding"),
        max_bytes=request.app[SETTINGS].max_body_bytes,
    )
    return raw, decoded


async def _path_a(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    raw, body = await read_body(request)
    parsed = endpoint.parse_request(body, request.app[VOCABULARY].loaded.vocab_size)
    if not parsed.is_codec:
        # JSON is not Codec traffic: never refused for its version. Passed through byte for
        # byte (coding and all) unless a safety policy must read it.
        if SAFETY_POLICY in request.app:
            return await police_json(request, body, endpoint)
        return await relay(request, body=raw)
    plan = codec_plan(
        request,
        endpoint,
        upstream_path=request_target(request),
        upstream=parsed.upstream(),
        stream_format=parsed.stream_format,
    )
    return await serve_codec(request, plan)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _path_a(request, COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _path_a(request, CHAT)


async def completions_codec(request: web.Request) -> web.StreamResponse:
    _, body = await read_body(request)
    parsed = decode_codec_request(
        body,
        request.headers.get("Content-Type"),
        vocab_size=request.app[VOCABULARY].loaded.vocab_size,
    )
    plan = codec_plan(
        request,
        COMPLETIONS,
        upstream_path=COMPLETIONS.upstream_path,
        upstream=UpstreamRequest(COMPLETIONS.name, parsed.completion_fields()),
        stream_format=parsed.stream_format,
        resolve_model=True,
    )
    return await serve_codec(request, plan)
