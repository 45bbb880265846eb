"""The tokenizer maps and zstd dictionaries a client has loaded, each pinned by its sha256.

A Codec stream names both by digest: `Codec-Tokenizer-Map: <id> sha256:<hex>` the map its IDs
follow, `Codec-Zstd-Dict: sha256:<hex>` the dictionary a zstd body needs. The client fetches
each once, from the discovery paths (`/.well-known/codec/maps/sha256/<hex>.json`,
`/.well-known/codec/dicts/<hex>.zstd`), reading it within a bound and hashing it as it comes
(reading.py), checks that the bytes hash to the digest, and keeps them by it. Bytes that do
not are a hard error, never a fallback: the spec makes a map mismatch "a fatal session error"
and forbids decompressing with another dictionary (codec-spec.md §4, §10), and a client that
quietly fell back to JSON would hide a server or a cache serving the wrong bytes.
"""

from __future__ import annotations

import hashlib
import threading

import orjson

from proxy.core.compression.dictionaries import declared_dictionaries, is_sha256_hex
from proxy.core.errors import TokenizerMapError, UpstreamProtocolError
from proxy.core.verify.map_decoder import MapDecoder

__all__ = ["CodecAssets", "CodecIntegrityError", "dictionary_digest"]

_SHA256_PREFIX = "sha256:"


class CodecIntegrityError(UpstreamProtocolError):
    """A map or dictionary whose bytes are not the ones the response named (502: the server
    sent them). `code`: `hash_mismatch`, or `not_a_map` for bytes that hash right but are no
    tokenizer map."""


def dictionary_digest(value: str | None) -> str | None:
    """The 64-hex digest in `Codec-Zstd-Dict`, or None when it is not `sha256:<64 lowercase
    hex>`, the only form codecai accepts (interop.md §0.8)."""
    if value is None or not value.startswith(_SHA256_PREFIX):
        return None
    digest = value[len(_SHA256_PREFIX) :]
    return digest if is_sha256_hex(digest) else None


def _checked(what: str, digest: str, data: bytes, sha256: str | None) -> None:
    actual = hashlib.sha256(data).hexdigest() if sha256 is None else sha256
    if actual != digest:
        raise CodecIntegrityError(
            f"the {what} served for sha256:{digest} hashes to sha256:{actual}: refusing it",
            code="hash_mismatch",
        )


class CodecAssets:
    """Maps (as decoders) and dictionaries by digest, shared by every request of a transport,
    or of several (pass one to both the sync and the async transport)."""

    __slots__ = ("_declared", "_dictionaries", "_lock", "_maps")

    def __init__(self) -> None:
        self._maps: dict[str, MapDecoder] = {}
        self._declared: dict[str, tuple[tuple[str, str], ...]] = {}
        self._dictionaries: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def map(self, digest: str) -> MapDecoder | None:
        return self._maps.get(digest)

    def add_map(self, digest: str, body: bytes, *, sha256: str | None = None) -> MapDecoder:
        """The decoder of a fetched map, once its bytes are checked against `digest` (`sha256`:
        theirs, when the caller hashed them as it read them). A second load of the same digest
        keeps the first decoder."""
        _checked("tokenizer map", digest, body, sha256)
        try:
            document = orjson.loads(body)
            if not isinstance(document, dict):
                raise TokenizerMapError("tokenizer map is not a JSON object")
            decoder = MapDecoder.from_document(document, digest=digest)
        except (orjson.JSONDecodeError, TokenizerMapError) as exc:
            raise CodecIntegrityError(
                f"sha256:{digest} is no tokenizer map: {exc}", code="not_a_map"
            ) from exc
        with self._lock:
            self._declared.setdefault(digest, declared_dictionaries(document))
            return self._maps.setdefault(digest, decoder)

    def forget_map(self, digest: str) -> None:
        """Drop the map `digest`: an answer's IDs went past its vocabulary, so the next answer
        naming it fetches and checks it again (answer.py)."""
        with self._lock:
            self._maps.pop(digest, None)

    def declared_dictionaries(self, digest: str) -> tuple[tuple[str, str], ...]:
        """(wire format, 64-hex sha256) of the dictionaries the loaded map `digest` lists:
        what its server may compress with, and a client may fetch before it asks for zstd."""
        return self._declared.get(digest, ())

    def dictionary(self, digest: str) -> bytes | None:
        return self._dictionaries.get(digest)

    def add_dictionary(self, digest: str, data: bytes, *, sha256: str | None = None) -> bytes:
        _checked("zstd dictionary", digest, data, sha256)
        with self._lock:
            return self._dictionaries.setdefault(digest, data)
