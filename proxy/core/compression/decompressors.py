"""Streaming decompressors: a Codec response's content coding undone as its bytes arrive.

The client side of compressors.py, for whoever reads a Codec body: the OpenAI SDK transport
(proxy/sdk/) and the renderer's body (proxy/core/render/body.py). A generic HTTP client cannot
do it for them: dictionary zstd decodes only with the dictionary `Codec-Zstd-Dict` names
(codec-spec.md §5), and httpx fails such a stream with "Dictionary mismatch" (interop.md §1.3).

`feed` returns what the bytes so far decode to: a server that sync-flushes after a frame (as
this proxy does, compressors.py) lets every frame out at once. `flush` checks that the stream
ended where the coding says it ends; a cut stream, bytes after the end, or bytes that are not
the coding raise `DecompressionError`.
"""

from __future__ import annotations

import zlib
from typing import Final, Protocol

import brotli
import zstandard

from proxy.core.errors import UpstreamProtocolError
from proxy.core.http.content_coding import BR, CODING_ALIASES, GZIP, IDENTITY, ZSTD, ContentCoding
from proxy.core.shown import clipped, quoted

__all__ = ["DecompressionError", "StreamDecompressor", "new_decompressor"]


class DecompressionError(UpstreamProtocolError):
    """A response body that is not what its `Content-Encoding` says (502: the peer sent it)."""


class StreamDecompressor(Protocol):
    @property
    def coding(self) -> ContentCoding: ...

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> None: ...


def _corrupt(coding: str, detail: object) -> DecompressionError:
    return DecompressionError(
        f"response body is not valid {coding}: {clipped(str(detail))}", code="bad_coding"
    )


class IdentityDecompressor:
    __slots__ = ()
    coding: Final = IDENTITY

    def feed(self, data: bytes) -> bytes:
        return data

    def flush(self) -> None:
        return None


class GzipDecompressor:
    __slots__ = ("_zlib",)
    coding: Final = GZIP

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(wbits=31)

    def feed(self, data: bytes) -> bytes:
        if self._zlib.eof:
            if data:
                raise _corrupt(GZIP, "bytes after the end of the gzip stream")
            return b""
        try:
            out = self._zlib.decompress(data)
        except zlib.error as exc:
            raise _corrupt(GZIP, exc) from exc
        if self._zlib.unused_data:
            # One member: our compressor writes one per response (RFC 1952 allows several,
            # but a Codec body that is several gzip streams was not written by one compressor).
            raise _corrupt(GZIP, "bytes after the end of the gzip stream")
        return out

    def flush(self) -> None:
        if not self._zlib.eof:
            raise _corrupt(GZIP, "the stream was cut before its end")


class BrotliDecompressor:
    __slots__ = ("_brotli",)
    coding: Final = BR

    def __init__(self) -> None:
        self._brotli = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        if self._brotli.is_finished():
            raise _corrupt(BR, "bytes after the end of the brotli stream")
        try:
            out: bytes = self._brotli.process(data)
        except brotli.error as exc:
            raise _corrupt(BR, exc) from exc
        return out

    def flush(self) -> None:
        if not self._brotli.is_finished():
            raise _corrupt(BR, "the stream was cut before its end")


class ZstdDecompressor:
    __slots__ = ("_zstd",)
    coding: Final = ZSTD

    def __init__(self, dictionary: bytes) -> None:
        zdict = zstandard.ZstdCompressionDict(dictionary)
        self._zstd = zstandard.ZstdDecompressor(dict_data=zdict).decompressobj()

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        if self._zstd.eof:
            raise _corrupt(ZSTD, "bytes after the end of the zstd frame")
        try:
            out: bytes = self._zstd.decompress(data)
        except zstandard.ZstdError as exc:
            raise _corrupt(ZSTD, exc) from exc
        if self._zstd.unused_data:
            raise _corrupt(ZSTD, "bytes after the end of the zstd frame")
        return out

    def flush(self) -> None:
        if not self._zstd.eof:
            raise _corrupt(ZSTD, "the stream was cut before its end")


def new_decompressor(
    content_encoding: str | None, zstd_dictionary: bytes | None = None
) -> StreamDecompressor:
    """The decompressor for a response's `Content-Encoding` (one coding, as we send).

    zstd needs the dictionary the response names: a Codec zstd stream never decodes without it
    (codec-spec.md §5, "MUST NOT decompress with a different dict"; the caller checks the
    hash before it gets here).
    """
    name = (content_encoding or IDENTITY).strip().lower()
    name = CODING_ALIASES.get(name, name)
    if name in ("", IDENTITY):
        return IdentityDecompressor()
    if name == GZIP:
        return GzipDecompressor()
    if name == BR:
        return BrotliDecompressor()
    if name == ZSTD:
        if zstd_dictionary is None:
            raise DecompressionError(
                "a zstd Codec response decodes only with the dictionary it names",
                code="zstd_dictionary_missing",
            )
        return ZstdDecompressor(zstd_dictionary)
    raise DecompressionError(
        f"response Content-Encoding {quoted(content_encoding or '')} is not one we decode",
        code="unsupported_content_encoding",
    )
