"""A model whose upstream speaks Codec: JSON clients get JSON, the hop upstream carries frames.

`upstream_protocol = "codec"` puts codec-proxy in front of a Codec server (another codec-proxy
across a region or a WAN, an engine that speaks Codec), serving clients that know nothing of
Codec (docs/DEPLOY.md "Codec on the long hop"). What becomes of each request:

* A JSON generation request that frames can answer whole (proxy/core/client/ask.py: one choice,
  no log probabilities or echo, one prompt, text only; streamed or not) is asked as Codec: the
  same body with `stream_format` and `stream: true`, `Codec-Client-Version`, and an
  `Accept-Encoding` of what this proxy decodes (`zstd` only once it holds the dictionary the
  upstream's map lists for the format). The answer is read (proxy/core/client/answer.py, the
  plan the OpenAI SDK transport follows too) and rendered as the client asked: SSE chunks, or
  the whole answer (proxy/core/render/response.py).
* Anything else (n > 1, logprobs, a batch, `stream_format: "json"`, every other route) is relayed
  as it is, and so is a Codec client's own request (Path A with a binary `stream_format`, Path
  B), after this proxy's own rollout switches and version gate: the upstream answers it itself.
* Before the stream starts, the upstream's own error is the answer, relayed. But a refusal of
  Codec (403 `codec_not_enabled`, 426, 503 `tokenizer_mismatch`/`verification_mismatch`) means
  "ask again as JSON" (docs/ROLLOUT.md): the request goes again as the client sent it, and no
  Codec is asked of that model for a while (the refusal's `Retry-After`, else 300 s).
* A 200 that is not frames (the upstream ignored `stream_format`) is relayed as it is when the
  client streams; a client that wanted the whole answer gets the request asked again as JSON.
  No Codec is asked for a while either way.
* An answer whose map or dictionary cannot be fetched, or does not verify, is never rendered:
  it is closed and the request asked again as JSON (proxy/server/models/upstream_maps.py says
  what `/readyz` shows then).
* An answer whose IDs go past its map's vocabulary ends as an error (the stream's error event,
  or a 502 for a whole answer), and the map is fetched again before it renders another.

Each outcome is counted in `codec_proxy_codec_upstream_requests_total{model, result}`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web

from proxy.core.client.answer import Frames, NotFrames, Unrenderable, read_answer
from proxy.core.client.ask import (
    DEFAULT_REMEMBER_SECONDS,
    CodecAsk,
    codec_ask_for,
    codec_headers,
    fallback_for,
)
from proxy.core.client.assets import CodecIntegrityError
from proxy.core.client.reading import MAX_ERROR_BYTES, read_whole
from proxy.core.compression.decompressors import DecompressionError
from proxy.core.endpoints import Endpoint
from proxy.core.errors import ProxyError, UpstreamProtocolError
from proxy.core.http.content_coding import IDENTITY, codec_accept_encoding
from proxy.core.render.response import STREAM_HEADERS, WHOLE_HEADERS, RenderedResponseBody
from proxy.server.control.auth import presented_key
from proxy.server.control.codec import admit_codec
from proxy.server.control.exchanges import stream_context
from proxy.server.control.headers import forward_headers, request_target, upstream_response_headers
from proxy.server.control.relay import relay, relay_response
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.stream import StreamedResponse, StreamEnd, stream_response
from proxy.server.models.live import config_of
from proxy.server.models.served_models import ServedModel, model_of
from proxy.server.models.upstream_maps import MapUnavailable, UpstreamMaps
from proxy.server.telemetry.metrics import METRICS
from proxy.server.telemetry.record import RECORD

log = logging.getLogger("codec_proxy")

MODE: Final = "rendered"
# The client's own negotiation is for the JSON it gets; the upstream is asked for frames.
_UPSTREAM_DROP: Final = (
    "accept",
    "accept-encoding",
    "content-type",
    "content-encoding",
    "codec-client-version",
)

Repeat = Callable[[], Awaitable[web.StreamResponse]]


async def relay_codec_request(
    request: web.Request, model: ServedModel, body: bytes, *, drop: tuple[str, ...] = ()
) -> web.StreamResponse:
    """A Codec client's own request: this proxy's rollout switches and version gate, then the
    upstream, which speaks Codec, answers it as it is. Its map and dictionary are served here
    too once verified (server/control/well_known.py)."""
    admit_codec(request, model)
    _count(request, model, "relayed")
    return await relay(request, body=body, drop=drop, mode="codec")


async def serve_from_codec(
    request: web.Request, endpoint: Endpoint, fields: Mapping[str, Any], repeat: Repeat
) -> web.StreamResponse:
    """A JSON generation request (`fields`, the body as it goes upstream) for a model whose
    upstream speaks Codec. `repeat()` relays the client's request as it was sent."""
    model = model_of(request)
    maps = model.upstream_maps
    if maps is None:
        raise RuntimeError(f"model {model.name!r}: its Codec upstream's maps start with the app")
    fmt = model.config.upstream_stream_format
    ask = codec_ask_for(endpoint.name, fields, stream_format=fmt, whole=True)
    if isinstance(ask, str):
        log.debug("not asked as Codec (%s)", ask)
        _count(request, model, "relayed")
        return await repeat()
    # Refusals are remembered per model and the name the client asked for, as the SDK
    # transport remembers them per origin and model.
    key = (model.name, ask.model)
    if maps.refusals.refused(key, time.monotonic()) or not maps.may_ask():
        _count(request, model, "skipped")
        return await repeat()
    record = request[RECORD]
    if config_of(request).uncompressed(model.name, presented_key(request)):
        coding = IDENTITY  # the long hop too (core/http/uncompressed.py)
    else:
        coding = codec_accept_encoding(zstd=maps.zstd_dictionary() is not None)
    headers = [
        *forward_headers(request, drop=_UPSTREAM_DROP),
        *codec_headers(fmt, coding),
        ("Content-Type", "application/json"),
    ]
    context = stream_context(request, MODE)
    async with model.pool.open(
        context,
        method="POST",
        path_qs=request_target(request),
        headers=headers,
        body=ask.body,
    ) as exchange:
        head = exchange.head
        head_fields = head.headers
        answer = read_answer(head.status, head_fields)
        if isinstance(answer, Frames):
            rendered = await _rendered(request, context, exchange, ask, maps, answer)
            if rendered is not None:
                return rendered
        elif isinstance(answer, Unrenderable):
            log.warning("model %s: a Codec answer cannot be rendered: %s", model.name,
                        answer.detail)  # fmt: skip
            _count(request, model, "map_unavailable")
        elif isinstance(answer, NotFrames):
            # The upstream ignored stream_format: its JSON is the client's answer when it is the
            # stream the client asked for.
            maps.refusals.remember(key, time.monotonic(), DEFAULT_REMEMBER_SECONDS)
            _count(request, model, "answered_json")
            log.warning("model %s: the Codec upstream answered a Codec request with %s",
                        model.name, head_fields.get("Content-Type"))  # fmt: skip
            if ask.streamed:
                return await relay_response(request, context, exchange)
        elif answer.may_be_refusal:
            raw, whole = await exchange.read_all(MAX_ERROR_BYTES)
            if not whole:
                # It cannot be relayed whole any more, nor read for the refusal it may be.
                raise UpstreamProtocolError(
                    f"the upstream's {head.status} error body is over {MAX_ERROR_BYTES} bytes"
                )
            fallback = None
            try:
                error = read_whole(raw, head_fields.get("Content-Encoding"), MAX_ERROR_BYTES)
                fallback = fallback_for(head.status, head_fields, error.data)
            except ProxyError:
                pass  # not a refusal: relayed as it came
            if fallback is None:
                _count(request, model, "upstream_error")
                return _answer(exchange, raw)
            maps.refusals.remember(key, time.monotonic(), fallback.seconds)
            _count(request, model, "refused")
            log.info("model %s: the Codec upstream refused Codec (%s); JSON for %.0fs",
                     model.name, fallback.reason, fallback.seconds)  # fmt: skip
        else:
            _count(request, model, "upstream_error")
            return await relay_response(request, context, exchange)
    # The first exchange is over (its connection closed unless read to its end): the same
    # request again, as the client sent it.
    record.phase = "upstream_headers"
    return await repeat()


async def _rendered(
    request: web.Request,
    context: StreamContext,
    exchange: Exchange,
    ask: CodecAsk,
    maps: UpstreamMaps,
    answer: Frames,
) -> web.StreamResponse | None:
    """The Codec answer rendered; None when it cannot be (asked again as JSON)."""
    model = model_of(request)
    record = context.record
    try:
        decoder = await maps.load_map(answer.map_digest)
        dictionary = None
        if answer.dictionary_digest is not None:
            dictionary = await maps.load_dictionary(answer.dictionary_digest)
        rendered = answer.body(
            ask, decoder, dictionary, request_id=record.forwarded_id, created=int(time.time())
        )
    except CodecIntegrityError:
        _count(request, model, "map_mismatch")
        return None
    except (MapUnavailable, DecompressionError) as exc:
        log.warning("model %s: a Codec answer cannot be rendered: %s", model.name, exc.message)
        _count(request, model, "map_unavailable")
        return None
    record.stream_format = answer.stream_format
    record.encoding = answer.content_encoding
    body = RenderedResponseBody(rendered)
    record.phase = "first_token"

    def start() -> web.StreamResponse:
        if body.streamed:
            return StreamedResponse(status=200, headers=dict(STREAM_HEADERS))
        response = StreamedResponse(status=body.status, headers=dict(WHOLE_HEADERS))
        response.content_length = body.size
        return response

    response, end = await stream_response(request, context, exchange, body, start, timed=True)
    _count(request, model, "rendered")
    metrics = request.app[METRICS]
    metrics.rendered_tokens.labels(model.name, answer.stream_format).inc(body.tokens)
    record.tokens = body.tokens
    if body.error is not None:
        record.outcome = "upstream_error"
        log.warning("model %s: a Codec answer ended with error: %s", model.name, body.error)
    if body.map_drift:
        record.outcome = "upstream_error"
        maps.drifted(answer.map_digest)
    if end is StreamEnd.COMPLETE and body.done:
        # What follows the terminal frame is the coding's end: read it, keep the connection.
        exchange.drain_rest()
    else:
        # Cancel, don't drain: closing the connection is what makes the backend stop.
        exchange.cancel()
    return response


def _answer(exchange: Exchange, body: bytes) -> web.Response:
    """The upstream's error, read whole, as it sent it."""
    head = exchange.head
    response = web.Response(status=head.status, reason=head.reason, body=body)
    for name, value in upstream_response_headers(head, drop=("content-length",)):
        response.headers.add(name, value)
    return response


def _count(request: web.Request, model: ServedModel, result: str) -> None:
    request.app[METRICS].codec_upstream_requests.labels(model.name, result).inc()
