"""Which headers a proxy forwards (RFC 9110 §7.6.1) and which are its own business."""

from __future__ import annotations

from collections.abc import Iterable

# Hop-by-hop fields: they describe one connection, never the message (RFC 9110 §7.6.1), plus
# the pre-standard Keep-Alive and Proxy-Connection that servers still send.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

# W3C Trace Context's fields (§3.2 `traceparent`, §3.3 `tracestate`): the caller's trace.
TRACE_CONTEXT_FIELDS = frozenset({"traceparent", "tracestate"})


def end_to_end(
    headers: Iterable[tuple[str, str]], *, drop: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """The end-to-end headers of a message, in order, duplicates kept.

    Also drops every field the message's own `Connection` header names, and `drop` (lowercase).
    """
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    excluded = HOP_BY_HOP | named | {name.lower() for name in drop}
    return [(name, value) for name, value in pairs if name.lower() not in excluded]
