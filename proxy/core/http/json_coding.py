"""Which JSON responses the proxy compresses (`json_compression`), and their headers.

Backends send their OpenAI JSON uncompressed, and a JSON-SSE stream repeats the same keys, id,
model and timestamp in every event: on a stream-long window it compresses several times over.
Clients already ask for it (httpx, and so the OpenAI SDK, sends `Accept-Encoding: gzip,
deflate`; browsers more), so with `json_compression = "on"` the proxy compresses what it
relays when the upstream did not:

* an event stream (`text/event-stream`) on the flush schedule of Codec streams, cut at event
  ends (bodies.py, `CompressedEventsBody`);
* any other JSON body whole (`CompressedWholeBody`), sent with its new length.

What is left as it came, with the reasons:

* a response the upstream already encoded: never coded twice, its `Content-Encoding` stands;
* `Cache-Control: no-transform` on the response: RFC 9110 §7.7 forbids a proxy to change the
  content; on the request: the client asks intermediaries not to (RFC 9111 §5.2.1.6);
* errors (4xx, 5xx): a few hundred bytes, which gzip's 18 bytes of header and trailer make
  no smaller, and the proxy's own errors are sent plain too, so every error reads the same;
* responses without content (204, 205, 304; 206's range is of the identity bytes);
* anything that is not JSON.

A compressible response carries `Vary: Accept-Encoding` whatever coding it got, identity
included: the same request with another `Accept-Encoding` gets other bytes. A HEAD request gets
the header fields its GET would get, but no `Content-Length`, which only compressing the
content would tell (RFC 9110 §9.3.2 allows leaving it out).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from proxy.core.http.content_coding import IDENTITY, ContentCoding

# An event stream is flushed as it goes; any other JSON body is compressed whole.
JsonBody = Literal["events", "whole"]

_EVENT_STREAM: Final = "text/event-stream"
_JSON: Final = "application/json"
# Successful responses without content of their own to code (RFC 9110 §15.3.5-7).
_NO_CODED_CONTENT: Final = frozenset({204, 205, 206})
# Fields that describe the identity content: wrong for the coded one (RFC 9530 digests).
_IDENTITY_ONLY: Final = frozenset({"content-length", "content-digest", "repr-digest"})


def compressible_json(
    *,
    status: int,
    content_type: str | None,
    content_encoding: str | None,
    cache_control: str | None,
    request_cache_control: str | None = None,
) -> JsonBody | None:
    """How a response would be compressed (module docstring), None when it is left as it came.

    The values are the upstream's fields (`request_cache_control`: the client's), lists joined
    with commas; None when absent.
    """
    if not 200 <= status < 300 or status in _NO_CODED_CONTENT:
        return None
    if content_encoding is not None and content_encoding.strip().lower() not in ("", IDENTITY):
        return None
    if any(_no_transform(field) for field in (cache_control, request_cache_control)):
        return None
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == _EVENT_STREAM:
        return "events"
    if media == _JSON or (media.startswith("application/") and media.endswith("+json")):
        return "whole"
    return None


def coded_headers(
    headers: Iterable[tuple[str, str]], coding: ContentCoding
) -> list[tuple[str, str]]:
    """The upstream's end-to-end `headers`, as the response in `coding` carries them.

    `Vary` gains `Accept-Encoding` (merged into the first `Vary` field, unless it lists it or
    `*`). Coded: `Content-Encoding` is ours; the fields that describe the identity content
    (`Content-Length`: the caller sets the coded length when it knows it) are dropped; a strong
    `ETag` becomes weak, since the coded bytes are another representation of the same content
    (RFC 9110 §8.8.1).
    """
    out: list[tuple[str, str]] = []
    vary_at: int | None = None
    varies = False
    for name, value in headers:
        lower = name.lower()
        if coding != IDENTITY:
            if lower in _IDENTITY_ONLY or lower == "content-encoding":
                continue
            if lower == "etag" and not value.lstrip().startswith("W/"):
                value = f"W/{value.strip()}"
        if lower == "vary":
            tokens = _tokens(value)
            varies |= "accept-encoding" in tokens or "*" in tokens
            if vary_at is None:
                vary_at = len(out)
        out.append((name, value))
    if not varies:
        if vary_at is None:
            out.append(("Vary", "Accept-Encoding"))
        else:
            name, value = out[vary_at]
            listed = f"{value}, " if value.strip() else ""
            out[vary_at] = (name, f"{listed}Accept-Encoding")
    if coding != IDENTITY:
        out.append(("Content-Encoding", coding))
    return out


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def _no_transform(cache_control: str | None) -> bool:
    return cache_control is not None and "no-transform" in _tokens(cache_control)
