"""`POST /v1/completions/codec` (Path B, codec-spec.md §3.3): a binary `CodecRequest` in, the same
Codec frames as Path A out.

The body is decoded and checked by the sans-IO core (proxy/core/codec_request.py) before the
upstream is contacted; its `prompt_ids` go to the backend's `/v1/completions` as a token-ID
prompt, never detokenized (§9). The response format follows the body's `stream_format`.
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.chunks import parse_completion_chunk
from proxy.core.codec_request import decode_codec_request
from proxy.core.upstream_body import UpstreamRequest
from proxy.server.codec_stream import codec_plan, stream_codec
from proxy.server.completions import read_body
from proxy.server.keys import VOCABULARY

_UPSTREAM_PATH = "/v1/completions"


async def completions_codec(request: web.Request) -> web.StreamResponse:
    _, body = await read_body(request)
    parsed = decode_codec_request(
        body,
        request.headers.get("Content-Type"),
        vocab_size=request.app[VOCABULARY].loaded.vocab_size,
    )
    plan = codec_plan(
        request,
        upstream_path=_UPSTREAM_PATH,
        upstream=UpstreamRequest("completions", parsed.completion_fields()),
        stream_format=parsed.stream_format,
        parse_chunk=parse_completion_chunk,
        resolve_model=True,
    )
    return await stream_codec(request, plan)
