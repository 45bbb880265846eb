"""Headers on their way through: what goes upstream, what comes back, as they were sent."""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.core.errors import BadRequest
from proxy.core.http.headers import TRACE_CONTEXT_FIELDS, end_to_end
from proxy.core.shown import quoted
from proxy.server.data.upstream_protocol import ResponseHead
from proxy.server.models.live import config_of
from proxy.server.telemetry.record import RECORD, REQUEST_ID_HEADER

log = logging.getLogger("codec_proxy")

# Set by the upstream client from the URL and the body; never copied from the client's request.
_REQUEST_DROP = ("host", "content-length")


def request_target(request: web.Request) -> str:
    """Path and query exactly as the client wrote them (yarl would re-quote the query)."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


def _as_sent(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[str, str]]:
    """Header fields as text that aiohttp writes back as the very bytes received.

    aiohttp serializes header values as UTF-8, so a value goes through unchanged exactly when
    it is UTF-8 (ASCII included); other bytes (RFC 9110 §5.5 obs-text) raise
    UnicodeDecodeError: they cannot be relayed as they are, and are not relayed changed.
    """
    return [(name.decode(), value.decode()) for name, value in raw]


def forward_headers(request: web.Request, *, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The client's end-to-end headers for the upstream request, with our request id.

    Not the client's Authorization when it carried the proxy's own API key
    (proxy/server/control/auth.py), nor its trace context when it is not trusted
    (`trust_trace_context`: a traced request's attempt sends its own, data/upstreams.py).
    """
    try:
        raw = _as_sent(request.raw_headers)
    except UnicodeDecodeError as exc:
        raise BadRequest(
            "a request header holds bytes that are not UTF-8; they cannot be relayed unchanged",
            code="invalid_header_bytes",
        ) from exc
    live = config_of(request)
    if not live.forward_authorization:
        drop = (*drop, "authorization")
    if not live.settings.trust_trace_context:
        drop = (*drop, *TRACE_CONTEXT_FIELDS)
    headers = end_to_end(raw, drop=(*_REQUEST_DROP, REQUEST_ID_HEADER.lower(), *drop))
    # The request id travels upstream (vLLM logs it), the client's or the one we made up.
    return [*headers, (REQUEST_ID_HEADER, request[RECORD].forwarded_id)]


def combined_header(request: web.Request, name: str) -> str | None:
    """A list-valued field sent as several lines is one comma-joined list (RFC 9110 §5.3)."""
    values = request.headers.getall(name, [])
    return ", ".join(values) if values else None


def upstream_response_headers(
    upstream: ResponseHead, *, drop: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """The upstream's end-to-end response headers, as sent. A field that cannot be relayed
    unchanged (see `_as_sent`) is left out, with a warning, rather than changed."""
    raw = []
    for name, value in upstream.raw_headers:
        try:
            raw += _as_sent(((name, value),))
        except UnicodeDecodeError:
            log.warning("dropped upstream response header %s: not UTF-8", quoted(name))
    return end_to_end(raw, drop=drop)
