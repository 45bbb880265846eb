"""HTTP/1.1 message framing, sans-IO: a response body on its way out, a request head.

The data plane writes response bodies straight to the client's transport, past aiohttp's
writer, so the framing aiohttp would apply is decided here (RFC 9112 §6). The steady path
(proxy/server/data/stream.py's `on_data`) writes a chunk's framing itself, the one copy of
`frame`'s chunked case, so that a read stays one Python frame:

* `chunked`: each write is one chunk, `<hex size>\\r\\n<data>\\r\\n`; an empty write is never a
  chunk, because the zero-size chunk is the body's end (§7.1), which aiohttp writes at the end;
* `length`: `Content-Length` bytes and not one more (§6.3): a longer upstream body is clipped;
* `close`: neither, the body ends when the connection does (HTTP/1.0 clients);
* `empty`: a response that has no body whatever its headers say (HEAD, 204, 304; §6.3).

The upstream request's head is written here too: the data plane owns its upstream connections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from typing import Final

from proxy.core.shown import quoted


class Framing(Enum):
    CHUNKED = "chunked"
    LENGTH = "length"
    CLOSE = "close"
    EMPTY = "empty"


class BodyFramer:
    """One response body's framing: `frame(data)` is what goes on the wire for `data`."""

    __slots__ = ("framing", "remaining")

    def __init__(self, framing: Framing, length: int | None = None) -> None:
        if (framing is Framing.LENGTH) != (length is not None):
            raise ValueError("a length is given exactly for Content-Length framing")
        self.framing = framing
        # Bytes still owed under Content-Length framing; None for the others.
        self.remaining = length

    @classmethod
    def for_response(cls, *, chunked: bool, length: int | None, empty: bool) -> BodyFramer:
        """The framing aiohttp chose for a prepared response (its writer's `chunked` and
        `length`), or `empty` for a response that must have no body."""
        if empty:
            return cls(Framing.EMPTY)
        if chunked:
            return cls(Framing.CHUNKED)
        if length is not None:
            return cls(Framing.LENGTH, length)
        return cls(Framing.CLOSE)

    def frame(self, data: bytes) -> bytes:
        framing = self.framing
        if framing is Framing.CHUNKED:
            return b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        if framing is Framing.LENGTH:
            remaining = self.remaining or 0
            if len(data) > remaining:
                data = data[:remaining]
            self.remaining = remaining - len(data)
            return data
        if framing is Framing.CLOSE:
            return data
        return b""

    @property
    def complete(self) -> bool:
        """Whether everything the head promised has been framed (always, unless a
        Content-Length body is still owed bytes): a connection whose body ended short must
        be closed, never reused."""
        return not self.remaining


# RFC 9110 §5.5: no CR, LF or NUL in a field value; §5.1: a name is a token.
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FORBIDDEN_IN_VALUE: Final = re.compile(rb"[\x00\r\n]")


class HeaderInjection(ValueError):
    """A header would break the message it is written into."""


def request_head(
    method: str, target: str, headers: Iterable[tuple[str, str]], *, body_length: int | None
) -> bytes:
    """An HTTP/1.1 request head (RFC 9112 §3): the request line, `headers` as given (which
    must hold `Host`), and `Content-Length` when the request has a body.

    `body_length` None: no body, and none is announced. Header values go out as UTF-8, as
    aiohttp writes them, so a value received as UTF-8 goes upstream as the same bytes.
    """
    if not _TOKEN.fullmatch(method.encode("ascii", "replace")):
        raise HeaderInjection(f"not a method: {quoted(method)}")
    line = f"{method} {target} HTTP/1.1\r\n".encode()
    if b" " in line[len(method) + 1 : -11] or _FORBIDDEN_IN_VALUE.search(line[:-2]):
        raise HeaderInjection("the request target holds a space or a line break")
    parts = [line]
    for name, value in headers:
        raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
        if not _TOKEN.fullmatch(raw_name) or _FORBIDDEN_IN_VALUE.search(raw_value):
            raise HeaderInjection(f"header {quoted(name)} cannot be written as it is")
        parts.append(b"%b: %b\r\n" % (raw_name, raw_value))
    if body_length is not None:
        parts.append(b"Content-Length: %d\r\n" % body_length)
    parts.append(b"\r\n")
    return b"".join(parts)
