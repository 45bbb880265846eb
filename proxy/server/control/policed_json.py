"""JSON completions under a safety policy: the upstream's answer, checked before it is sent.

Only used when a policy is configured; without one, JSON stays on the byte-for-byte relay.
Streamed answers go through the shared pump with a `PolicedJsonBody`; whole bodies are read
(up to `max_body_bytes`), checked and sent at once. With `json_compression` on, either is
compressed for a client that accepts it, as the relay does (json_compression.py).
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.core.bodies import PolicedJsonBody, ResponseBody
from proxy.core.endpoints import Endpoint
from proxy.core.errors import UpstreamProtocolError
from proxy.core.safety.json_policing import JsonStreamPolicer, Verdict, police_json_body
from proxy.core.safety.policy import SafetyPolicy
from proxy.core.safety.stream import PolicedText
from proxy.server.control.exchanges import stream_context
from proxy.server.control.headers import forward_headers, request_target, upstream_response_headers
from proxy.server.control.json_compression import JsonCompression, json_compression
from proxy.server.control.relay import relay_response
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.stream import StreamedResponse, stream_response
from proxy.server.data.upstream_protocol import ResponseHead
from proxy.server.models.live import config_of
from proxy.server.models.served_models import model_of
from proxy.server.telemetry.record import RECORD

log = logging.getLogger("codec_proxy")

# We must read the text to check it: ask for it uncompressed (the body sent up is the decoded
# one, proxy/server/control/generation.py: read_body).
_UPSTREAM_DROP = ("accept-encoding", "content-encoding")
_UPSTREAM_ADD = [("Accept-Encoding", "identity")]
# Rewritten bodies get their own length; the policy headers depend on the client's version.
_RESPONSE_DROP = ("content-length", "content-encoding")


async def police_json(
    request: web.Request, body: bytes, endpoint: Endpoint, policy: SafetyPolicy
) -> web.StreamResponse:
    context = stream_context(request, "policed")
    async with model_of(request).pool.open(
        context,
        method=request.method,
        path_qs=request_target(request),
        headers=forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD,
        body=body,
    ) as exchange:
        upstream = exchange.head
        if upstream.status != 200:
            return await relay_response(request, context, exchange)
        if upstream.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise UpstreamProtocolError(
                "upstream sent a compressed completion; it cannot be checked against the policy",
                code="unpoliceable_response",
            )
        if upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await _police_stream(request, context, exchange, policy, endpoint)
        return await _police_body(request, exchange, policy, endpoint)


def _policed_text(request: web.Request, policy: SafetyPolicy) -> PolicedText:
    vocabulary = model_of(request).vocabulary
    return PolicedText(policy.rules, vocabulary.scheme, vocabulary.loaded.tokenizer)


def _headers(
    upstream: ResponseHead, policy: SafetyPolicy, compression: JsonCompression | None
) -> list[tuple[str, str]]:
    kept = upstream_response_headers(upstream, drop=_RESPONSE_DROP)
    headers = [*kept, *policy.response_headers(), ("Vary", "Codec-Client-Version")]
    return headers if compression is None else compression.headers(headers)


async def _police_stream(
    request: web.Request,
    context: StreamContext,
    exchange: Exchange,
    policy: SafetyPolicy,
    endpoint: Endpoint,
) -> web.StreamResponse:
    policer = JsonStreamPolicer(
        lambda: _policed_text(request, policy),
        endpoint.streamed_text,
        max_event_bytes=config_of(request).settings.max_event_bytes,
    )
    context.record.phase = "first_byte"
    compression = json_compression(request, exchange.head)
    body: ResponseBody = PolicedJsonBody(policer)
    encoding = "identity"
    if compression is not None and compression.coded:
        context.record.encoding = encoding = compression.coding
        body = compression.body(PolicedJsonBody(policer))

    def start() -> web.StreamResponse:
        response = StreamedResponse(status=200)
        for name, value in _headers(exchange.head, policy, compression):
            response.headers.add(name, value)
        return response

    response, _ = await stream_response(request, context, exchange, body, start, encoding=encoding)
    if policer.stopped is not None:
        # Cancel, don't drain: closing the connection is what makes the backend stop.
        exchange.cancel()
    _log(policer.verdict, policer.dropped_events)
    return response


async def _police_body(
    request: web.Request, exchange: Exchange, policy: SafetyPolicy, endpoint: Endpoint
) -> web.Response:
    limit = config_of(request).settings.max_body_bytes
    raw, whole = await exchange.read_all(limit)
    if not whole:
        raise UpstreamProtocolError(
            "upstream completion body is over max_body_bytes; it was not checked",
            code="unpoliceable_response",
        )
    policed, verdict = police_json_body(
        raw, lambda: _policed_text(request, policy), endpoint.body_text
    )
    _log(verdict, 0)
    compression = json_compression(request, exchange.head)
    if compression is not None and compression.coded:
        request[RECORD].encoding = compression.coding
        policed = compression.whole(policed)
    response = web.Response(status=200, body=policed)
    for name, value in _headers(exchange.head, policy, compression):
        response.headers.add(name, value)
    return response


def _log(verdict: Verdict, dropped: int) -> None:
    # Category names are public (they are in the descriptor); rule contents never are.
    if verdict.stop is not None:
        log.info("safety policy stopped a JSON completion (category %s)", verdict.stop)
    if verdict.redactions:
        log.info(
            "safety policy redacted %d span(s) of a JSON completion (categories %s)",
            len(verdict.redactions),
            ", ".join(sorted(set(verdict.redactions))),
        )
    if dropped:
        log.warning("dropped %d unparsable upstream event(s) from a policed stream", dropped)
