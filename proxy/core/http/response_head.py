"""What of an upstream's response head the proxy can relay, sans-IO (RFC 9110 §15, RFC 9112).

The data plane parses heads with llhttp, which reads any three-digit status, any reason phrase
without CR or LF, and any `Transfer-Encoding`. These decide what a parsed head means here:

* a status the proxy can answer with: 100-599 (RFC 9110 §15), and never 101, since the proxy
  asks no upstream to switch protocols (`Upgrade` is hop-by-hop, so no request carries one;
  RFC 9110 §15.2.2 forbids a 101 without it);
* a body it can read to its end: `Transfer-Encoding`, when the head has one, is exactly one
  `chunked`. With another coding last, the body runs until the connection closes (RFC 9112
  §6.3), and with a coding under `chunked` (`gzip, chunked`) what is de-chunked is still coded:
  the proxy would relay it as if it were the content;
* a reason phrase it repeats as sent, or its own: printable ASCII, space and tab up to
  `MAX_REASON_BYTES` (RFC 9112 §4 allows any visible byte; a client ignores the phrase).
"""

from __future__ import annotations

import re
from typing import Final

from proxy.core.shown import quoted

# The longest reason phrase relayed as sent. The registered phrases have at most 31 characters
# ("Network Authentication Required"); beyond this the upstream is not saying anything a
# client reads, and the status line would carry its bytes to every client.
MAX_REASON_BYTES: Final = 128
# What the status line aiohttp writes carries back byte for byte (it writes it as UTF-8, so
# obs-text would change) and what no client can mistake for the line's end.
_RELAYED_REASON: Final = re.compile(rb"[\t\x20-\x7e]{0,%d}" % MAX_REASON_BYTES)


def status_refusal(status: int) -> str | None:
    """Why a final answer with `status` cannot be relayed (the proxy answers 502), or None."""
    if not 100 <= status <= 599:
        return f"status {status} is outside 100-599"
    if status == 101:
        return "status 101, but no request asks the upstream to switch protocols"
    return None


def transfer_coding_refusal(values: list[str]) -> str | None:
    """Why a body sent with these `Transfer-Encoding` field values cannot be read to its end
    as the proxy relays it (502), or None. `[]`: the head has no such field."""
    if not values:
        return None
    codings = [coding.strip().lower() for value in values for coding in value.split(",")]
    if codings == ["chunked"]:
        return None
    return f"Transfer-Encoding {quoted(', '.join(values))} is not the one coding chunked"


def relayed_reason(reason: bytes) -> str | None:
    """The upstream's reason phrase as the client gets it, or None when the proxy's own phrase
    for the status goes instead (a control character, or longer than `MAX_REASON_BYTES`)."""
    return reason.decode("ascii") if _RELAYED_REASON.fullmatch(reason) else None
