"""UTF-16 surrogate pairs an upstream cut in two, rejoined; lone surrogates refused.

JSON escapes a character outside the Basic Multilingual Plane as a UTF-16 pair (`🎉` is
`"\\ud83c\\udf89"`). A server that cuts its output between the two halves sends each as a lone
escape, in two events: `"Hello \\ud83c"`, then `"\\udf89 world"`. `json` reads those
(proxy/core/stream/chunks.py), but a lone surrogate is no text: it has no UTF-8, so no token can
stand for it and no client can be handed it. Where the high half ends one event's text and the
low half starts the next, the two make the character again; any other lone surrogate is the
upstream's protocol error, which ends the stream (a terminal error frame, codec-spec.md §2).
"""

from __future__ import annotations

import re

from proxy.core.errors import UpstreamProtocolError

__all__ = ["SurrogatePairs", "rejoined"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_HIGH_FIRST, _HIGH_LAST = "\ud800", "\udbff"


def rejoined(text: str) -> str:
    """`text` with each surrogate pair made its character; UpstreamProtocolError if a lone
    surrogate is left."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    # UTF-16 is where a pair means one character: through it and back, pairs are joined and
    # lone halves stay as they were.
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    lone = _SURROGATE.search(joined)
    if lone is not None:
        raise UpstreamProtocolError(
            f"upstream text has a lone UTF-16 surrogate, U+{ord(lone.group()):04X}, "
            f"at character {lone.start()} of a chunk",
            code="bad_upstream_chunk",
        )
    return joined


class SurrogatePairs:
    """One text field over a stream's events: a pair cut between two events is rejoined.

    `feed` each event's text in order; it returns the text with a trailing high surrogate held
    back for the next event. `flush` at the end: a high surrogate still held had no other half.
    """

    __slots__ = ("_high",)

    def __init__(self) -> None:
        self._high = ""

    def feed(self, text: str) -> str:
        if self._high:
            text, self._high = self._high + text, ""
        elif text.isascii() or _SURROGATE.search(text) is None:
            return text
        if text and _HIGH_FIRST <= text[-1] <= _HIGH_LAST:
            text, self._high = text[:-1], text[-1]
        return rejoined(text)

    def flush(self) -> None:
        if self._high:
            self._high = ""
            raise UpstreamProtocolError(
                "upstream text ended with the first half of a UTF-16 surrogate pair",
                code="bad_upstream_chunk",
            )
