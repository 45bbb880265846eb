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
from proxy.server.completions import answer, read_body


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw, body = await read_body(request)
    parsed = parse_chat_request(body)
    return await answer(request, raw, body, parsed, parse_chat_chunk, (CHAT_DELTA, CHAT_MESSAGE))
