"""Which content coding a Codec response uses: `Accept-Encoding` against what we can produce.

RFC 9110 §12.5.3 decides what the client accepts (q-values, `q=0` excludes, `*` stands for every
coding not listed, names are case-insensitive, identity is acceptable unless excluded). Among
the acceptable codings the server's order decides, not the client's q order: codec-spec.md §5
fixes the preference `zstd > br > gzip > identity`, and `zstd` only when a dictionary for the
response's wire format is loaded ("the dict is the precondition for using zstd at all").
"""

from __future__ import annotations

import re
from typing import Final, Literal

from proxy.core.errors import NotAcceptable
from proxy.core.http.negotiation import parse_qvalue

ContentCoding = Literal["identity", "gzip", "br", "zstd"]

IDENTITY: Final = "identity"
GZIP: Final = "gzip"
BR: Final = "br"
ZSTD: Final = "zstd"
SERVER_PREFERENCE: Final[tuple[ContentCoding, ...]] = (ZSTD, BR, GZIP, IDENTITY)

# RFC 9110 §8.4.1.3: recipients SHOULD treat x-gzip as gzip.
CODING_ALIASES: Final = {"x-gzip": GZIP}
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def coding_label(content_encoding: str | None) -> str:
    """A response's `Content-Encoding` as a bounded metric label: one of ours, or `other`
    (a relayed upstream may send any value, and label values must not grow without bound)."""
    name = (content_encoding or IDENTITY).strip().lower()
    name = CODING_ALIASES.get(name, name)
    return name if name in SERVER_PREFERENCE else "other"


def parse_accept_encoding(value: str) -> dict[str, float]:
    """`Accept-Encoding` as {coding: q}, lowercase, aliases folded, `*` kept.

    A malformed element (not a token, or a bad qvalue) is skipped rather than failing the
    request: it cannot say anything reliable, and the rest of the field still can. When a coding
    is listed twice the highest weight wins.
    """
    accepted: dict[str, float] = {}
    for element in value.split(","):
        coding, *params = (part.strip() for part in element.split(";"))
        if not coding:
            continue
        if not _TOKEN.fullmatch(coding):
            continue
        q: float | None = 1.0
        for param in params:
            name, _, raw = param.partition("=")
            if name.strip().lower() == "q":
                q = parse_qvalue(raw)
        if q is None:
            continue
        name = CODING_ALIASES.get(coding.lower(), coding.lower())
        accepted[name] = max(q, accepted.get(name, 0.0))
    return accepted


def weight(accepted: dict[str, float], coding: str) -> float:
    """The client's q for `coding` (RFC 9110 §12.5.3)."""
    if coding in accepted:
        return accepted[coding]
    if "*" in accepted:
        return accepted["*"]
    # identity is always acceptable unless excluded, by name or by `*;q=0`.
    return 1.0 if coding == IDENTITY else 0.0


def negotiate_coding(
    accept_encoding: str | None, *, zstd_dictionary: bool, allow_zstd: bool = True
) -> ContentCoding:
    """The coding of a Codec response, or `NotAcceptable` (406) when the client accepts none.

    `zstd_dictionary`: a dictionary for this response's wire format is loaded.
    `allow_zstd`: the client may receive zstd at all; version negotiation turns it off for
    clients below Codec 0.2, which must not get `Codec-Zstd-Dict` (codec-spec.md §4).
    """
    if accept_encoding is None:
        # No field: no preference (RFC 9110 §12.5.3). Codec compression is opt-in (§5).
        return IDENTITY
    accepted = parse_accept_encoding(accept_encoding)
    for coding in SERVER_PREFERENCE:
        if coding == ZSTD and not (zstd_dictionary and allow_zstd):
            continue
        if weight(accepted, coding) > 0.0:
            return coding
    raise NotAcceptable(
        f"none of the content codings we can send ({', '.join(SERVER_PREFERENCE[1:])}"
        f"{', zstd' if zstd_dictionary and allow_zstd else ''}) is acceptable to "
        f"Accept-Encoding: {accept_encoding!r}",
        code="no_acceptable_encoding",
    )
