"""JSON completions under a safety policy: the upstream's answer, checked before it is sent.

Only used when a policy is configured; without one, JSON stays on the byte-for-byte relay.
`police_json(request, body, stream_field, body_field)` is the entry point for any JSON
generation route (completions today; chat passes `CHAT_DELTA`/`CHAT_MESSAGE`).
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web

from proxy.core.errors import ProxyError, UpstreamProtocolError
from proxy.core.headers import end_to_end
from proxy.core.safety.json_policing import (
    JsonStreamPolicer,
    PolicedTextFactory,
    TextField,
    Verdict,
    police_json_body,
)
from proxy.core.safety.policy import SafetyPolicy
from proxy.core.safety.stream import PolicedText
from proxy.server.keys import LIFECYCLE, SAFETY_POLICY, SETTINGS, UPSTREAM, VOCABULARY
from proxy.server.observe import RECORD
from proxy.server.relay import forward_headers, relay_response, request_target
from proxy.server.upstream import Exchange

log = logging.getLogger("codec_proxy")

# We must read the text to check it: ask for it uncompressed.
# The body sent is the decoded one (server/completions.py: read_body).
_UPSTREAM_DROP = ("accept-encoding", "content-encoding")
_UPSTREAM_ADD = [("Accept-Encoding", "identity")]
# Rewritten bodies get their own length; the policy headers depend on the client's version.
_RESPONSE_DROP = ("content-length", "content-encoding")


async def police_json(
    request: web.Request, body: bytes, stream_field: TextField, body_field: TextField
) -> web.StreamResponse:
    policy = request.app[SAFETY_POLICY]
    vocabulary = request.app[VOCABULARY]

    def make() -> PolicedText:
        return PolicedText(policy.rules, vocabulary.scheme, vocabulary.loaded.tokenizer)

    headers = forward_headers(request, drop=_UPSTREAM_DROP) + _UPSTREAM_ADD
    record = request[RECORD]
    record.mode = "passthrough"
    with request.app[LIFECYCLE].tracking():
        async with request.app[UPSTREAM].open(
            request.method, request_target(request), headers=headers, data=body
        ) as exchange:
            record.upstream = exchange.upstream.url
            return await _police(request, exchange, policy, make, stream_field, body_field)


async def _police(
    request: web.Request,
    exchange: Exchange,
    policy: SafetyPolicy,
    make: PolicedTextFactory,
    stream_field: TextField,
    body_field: TextField,
) -> web.StreamResponse:
    upstream = exchange.response
    if upstream.status != 200:
        return await relay_response(request, exchange)
    if upstream.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise UpstreamProtocolError(
            "upstream sent a compressed completion; it cannot be checked against the policy",
            code="unpoliceable_response",
        )
    content_type = upstream.headers.get("Content-Type", "")
    if content_type.startswith("text/event-stream"):
        return await _police_stream(request, exchange, policy, make, stream_field)
    return await _police_body(request, exchange, policy, make, body_field)


def _headers(upstream: aiohttp.ClientResponse, policy: SafetyPolicy) -> list[tuple[str, str]]:
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
    kept = end_to_end(raw, drop=_RESPONSE_DROP)
    return [*kept, *policy.response_headers(), ("Vary", "Codec-Client-Version")]


async def _police_stream(
    request: web.Request,
    exchange: Exchange,
    policy: SafetyPolicy,
    make: PolicedTextFactory,
    field: TextField,
) -> web.StreamResponse:
    upstream = exchange.response
    response = web.StreamResponse(status=200)
    for name, value in _headers(upstream, policy):
        response.headers.add(name, value)
    await response.prepare(request)
    policer = JsonStreamPolicer(make, field, max_event_bytes=request.app[SETTINGS].max_event_bytes)
    try:
        async for chunk in exchange.chunks():
            out = policer.feed(chunk)
            if out:
                await response.write(out)
            if policer.stopped is not None:
                # Cancel, don't drain: closing the connection is what makes the backend stop.
                upstream.close()
                break
        else:
            await response.write(policer.end())
    except (ProxyError, aiohttp.ClientError, TimeoutError) as exc:
        # The status is sent; close rather than end cleanly so a truncated body is not taken
        # for a whole one (as the relay does).
        log.warning("policed JSON stream ended early: %s", exc)
        upstream.close()
        if request.transport is not None:
            request.transport.close()
        return response
    _log(policer.verdict, policer.dropped_events)
    await response.write_eof()
    return response


async def _police_body(
    request: web.Request,
    exchange: Exchange,
    policy: SafetyPolicy,
    make: PolicedTextFactory,
    field: TextField,
) -> web.Response:
    upstream = exchange.response
    limit = request.app[SETTINGS].max_body_bytes
    raw = bytearray()
    try:
        async for chunk in exchange.chunks():
            raw += chunk
            if len(raw) > limit:
                raise UpstreamProtocolError(
                    "upstream completion body is over max_body_bytes; it was not checked",
                    code="unpoliceable_response",
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamProtocolError(f"upstream body failed: {exc!r}") from exc
    policed, verdict = police_json_body(bytes(raw), make, field)
    _log(verdict, 0)
    response = web.Response(status=200, body=policed)
    for name, value in _headers(upstream, policy):
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
