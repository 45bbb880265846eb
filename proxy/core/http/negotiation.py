"""Content negotiation for Codec responses: media types named in `Accept`."""

from __future__ import annotations

import functools
import re
from typing import Final

from proxy.core.wire.formats import PREFIXED_MSGPACK_MEDIA_TYPE

# RFC 9110 §12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE: Final = re.compile(r"(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)")


def parse_qvalue(raw: str) -> float | None:
    """A weight as RFC 9110 §12.4.2 writes it, or None when it is not one ("2", "0.5555", "x")."""
    raw = raw.strip()
    return float(raw) if _QVALUE.fullmatch(raw) else None


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
                # A weight that is not one says nothing reliable: not acceptable.
                q = parse_qvalue(value) or 0.0
        accepted[media.lower()] = q
    return accepted


# A deployment's clients send few distinct `Accept` fields: each decided once, not once per
# request; a client sending a new one every time only churns this many.
@functools.lru_cache(maxsize=256)
def wants_prefixed_msgpack(accept: str | None) -> bool:
    if not accept:
        return False
    return accepted_media_types(accept).get(PREFIXED_MSGPACK_MEDIA_TYPE, 0.0) > 0.0
