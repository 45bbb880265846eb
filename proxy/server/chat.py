"""`POST /v1/chat/completions`: JSON passes through untouched; a binary `stream_format` becomes
Codec frames of the generated tokens (codec-spec.md §3.2, §12 item 37).

The chat template stays on the backend, so roles never reach the wire; role-only and empty
deltas produce no frame, reasoning text is tokenized in stream order, and tool calls ride on
the frames as `tool_calls` (proxy/core/transcode.py).
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.chunks import parse_chat_chunk
from proxy.core.request import parse_chat_request
from proxy.core.safety.json_policing import CHAT_DELTA, CHAT_MESSAGE
from proxy.server.codec_stream import codec_plan, stream_codec
from proxy.server.completions import read_body
from proxy.server.json_policy import police_json
from proxy.server.keys import SAFETY_POLICY
from proxy.server.relay import relay, request_target


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw, body = await read_body(request)
    parsed = parse_chat_request(body)
    if not parsed.is_codec:
        # Passed through byte for byte (coding and all) unless a safety policy must read it.
        if SAFETY_POLICY in request.app:
            return await police_json(request, body, CHAT_DELTA, CHAT_MESSAGE)
        return await relay(request, body=raw)
    plan = codec_plan(
        request,
        upstream_path=request_target(request),
        upstream=parsed.upstream(),
        stream_format=parsed.stream_format,
        parse_chunk=parse_chat_chunk,
    )
    return await stream_codec(request, plan)
