"""Content negotiation for Codec responses: media types named in `Accept`."""

from __future__ import annotations

# The Codec website's length-prefixed msgpack (codec-spec.md §11 items 1-2). Real clients
# (codecai, @codecai/web) decode the spec framing, so this is served only when named.
PREFIXED_MSGPACK_MEDIA_TYPE = "application/codec+msgpack"


def accepted_media_types(accept: str) -> dict[str, float]:
    """`Accept` as {media type: q}, lowercase, other parameters dropped (RFC 9110 §12.5.1)."""
    accepted: dict[str, float] = {}
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        accepted[media.lower()] = q
    return accepted


def wants_prefixed_msgpack(accept: str | None) -> bool:
    if not accept:
        return False
    return accepted_media_types(accept).get(PREFIXED_MSGPACK_MEDIA_TYPE, 0.0) > 0.0
