"""A body a Codec client reads to its end before it uses it: a map, a dictionary, an error.

Such a body comes from the server the client talks to and is never trusted to stay small
(SEC-02 §3, "reject, don't truncate"): `BodyReader` undoes its content coding as the bytes
arrive and holds no more than `limit` bytes of it, coded or decoded; a gzip or brotli bomb is
refused after `limit` bytes of output, never decoded whole. A map or a dictionary is named by
the sha256 of its bytes, so the digest is computed as they arrive: once the body ends, checking
it is a comparison (assets.py).

The limits are the same for every client: the edge in front of a Codec server and the SDK
transport read the same documents.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from proxy.core.compression.decompressors import new_decompressor
from proxy.core.errors import UpstreamProtocolError

__all__ = [
    "MAX_DICTIONARY_BYTES",
    "MAX_ERROR_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_MAP_BYTES",
    "BodyReader",
    "BodyTooLarge",
    "ReadBody",
    "read_whole",
]

# A Llama-3 map is 6 MB, a dictionary about 100 KB, an index a few hundred bytes per model:
# beyond these a server sends no such document.
MAX_MAP_BYTES: Final = 64 << 20
MAX_DICTIONARY_BYTES: Final = 16 << 20
MAX_INDEX_BYTES: Final = 1 << 20
# An error is a small JSON object: what a client reads of it (the refusal it may be, the
# message the SDK shows) is in its first bytes.
MAX_ERROR_BYTES: Final = 64 << 10


class BodyTooLarge(UpstreamProtocolError):
    """A body over the limit its reader was given (502: the server sent it)."""


@dataclass(frozen=True, slots=True)
class ReadBody:
    """A whole body, decoded, and the sha256 of its decoded bytes (64 lowercase hex)."""

    data: bytes
    sha256: str


class BodyReader:
    """`feed` each read of the body as it arrives (content-coded), `flush` at its end."""

    __slots__ = ("_data", "_decompressor", "_hash", "_limit", "_raw")

    def __init__(self, content_encoding: str | None, limit: int) -> None:
        # DecompressionError here for a coding this client does not decode.
        self._decompressor = new_decompressor(content_encoding, max_bytes=limit)
        self._limit = limit
        self._raw = 0
        self._data = bytearray()
        self._hash = hashlib.sha256()

    def feed(self, raw: bytes) -> None:
        # The coded bytes are capped too: a body coded larger than it may decode to is no
        # compression, and a gzip header's name field decodes to nothing at all.
        self._raw += len(raw)
        if self._raw > self._limit:
            raise BodyTooLarge(f"body is over {self._limit} bytes", code="body_too_large")
        for piece in self._decompressor.pieces(raw):
            self._hash.update(piece)
            self._data += piece

    def flush(self) -> ReadBody:
        self._decompressor.flush()
        return ReadBody(bytes(self._data), self._hash.hexdigest())


def read_whole(raw: bytes, content_encoding: str | None, limit: int) -> ReadBody:
    """A body already in hand, read as `BodyReader` reads one."""
    reader = BodyReader(content_encoding, limit)
    reader.feed(raw)
    return reader.flush()
