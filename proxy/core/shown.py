"""What an error message or a log line shows of a value the proxy did not choose.

Clients choose model names, `stream_format`, header values, paths and JSON keys; an upstream
chooses its header names and error bodies. Echoed whole, one 4 MiB `model` made a 4 MiB error
body and a 4 MiB log line; echoed raw, a newline in it started a log line of the client's
making. Such a value reaches a message only through `quoted` (`clipped` for a foreign text that
already quotes what it holds, such as a parser's error), which bounds it to `SHOWN_CHARS`.

Upstream URLs are the operator's, and may hold credentials (`http://user:pass@host`) that the
upstream gets as Basic authentication. Text that may hold one reaches a log line or the console
only through `without_credentials`.
"""

from __future__ import annotations

import re
from typing import Final

# Enough for any model name or media type in use; a log line holds a few such values.
SHOWN_CHARS: Final = 100


def clipped(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text`, cut to `limit` characters when longer, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def quoted(value: str | bytes, limit: int = SHOWN_CHARS) -> str:
    """`value` as a message shows it: quoted with control characters escaped (its `repr`),
    cut to `limit` characters (or bytes) when longer, saying how long it was."""
    if len(value) <= limit:
        return repr(value)
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{value[:limit]!r}... ({len(value)} {unit})"


# The userinfo of a URL: after "//", up to the authority's last "@" (RFC 3986 §3.2, §3.2.1;
# the authority ends at "/", "?" or "#"). Greedy, so a password holding an unescaped "@" goes
# whole. Whitespace, double quotes, angle brackets and backslashes end it too: they are not URI
# characters (§2), and stop a match running from one quoted value into the next.
_USERINFO = re.compile(r'(?<=//)[^/?#\s"<>\\]*@')
REDACTED_USERINFO: Final = "***"


def without_credentials(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by `***`.

    RFC 3986 §3.2.1: a password must not be rendered as clear text; the user goes too, since
    a URL's user is often a token itself (`https://<token>@host`).
    """
    if "@" not in text:
        return text
    return _USERINFO.sub(REDACTED_USERINFO + "@", text)
