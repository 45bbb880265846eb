"""Streaming compressors: one context per response, flushed without losing the window.

codec-spec.md §5: "a single compression context spans the whole response stream"; per-frame
contexts are rejected. No flush rule is written, and the reference servers buffer until the
end (interop.md §0.10, the "334x TTFB cliff"), so ours differ in one way: `sync()` makes
everything fed so far decodable by the client while keeping the window, so later frames are
still compressed against earlier ones:

- gzip: zlib, wbits=31 (gzip wrapper), `Z_PARTIAL_FLUSH`: like `Z_SYNC_FLUSH` it ends the
  block so an inflater can decode everything before it, but it appends a 10-bit empty fixed
  block instead of a 4-byte-aligned empty stored block (00 00 ff ff). At 2-3 tokens per flush
  that is 1 B/token less (docs/COMPRESSION.md, "gzip flush mode");
- br: brotli `process` + `flush` (BROTLI_OPERATION_FLUSH);
- zstd: `FLUSH_BLOCK` (ZSTD_e_flush: ends the block, not the frame); with the wire format's
  dictionary for Codec (`new_compressor`), without one for JSON (`plain_compressor`);
- identity: bytes pass through.

`feed` may return nothing (the compressor holds the bytes back); `sync` returns what the
client needs to decode everything fed; `flush` ends the stream (gzip trailer, last brotli
meta-block, zstd frame epilogue) and the compressor must not be used after it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final, Protocol

import brotli
import zstandard

from proxy.core.compression.dictionaries import LoadedZstdDictionary
from proxy.core.http.content_coding import BR, GZIP, IDENTITY, ZSTD, ContentCoding


class StreamCompressor(Protocol):
    """The same three calls for every content coding."""

    @property
    def coding(self) -> ContentCoding: ...

    def feed(self, data: bytes) -> bytes: ...

    def sync(self) -> bytes: ...

    def flush(self) -> bytes: ...


@dataclass(frozen=True)
class CompressionLevels:
    """Encoder effort per coding; the defaults are the ones bench/compression.py chose.

    A sync flush ends the encoder's current block, so a stream flushed every few frames is a
    chain of tiny blocks; in those, higher effort buys little and costs CPU on every flush.
    """

    gzip: int = 6
    brotli_quality: int = 5
    # 22 is brotli's default window (4 MiB): the whole of a long stream stays in view.
    brotli_lgwin: int = 22
    zstd: int = 3


DEFAULT_LEVELS: Final = CompressionLevels()


class IdentityCompressor:
    __slots__ = ()
    coding: Final = IDENTITY

    def feed(self, data: bytes) -> bytes:
        return data

    def sync(self) -> bytes:
        return b""

    def flush(self) -> bytes:
        return b""


class GzipCompressor:
    __slots__ = ("_zlib",)
    coding: Final = GZIP

    def __init__(self, level: int = DEFAULT_LEVELS.gzip) -> None:
        # wbits=31: the gzip wrapper (RFC 1952) that `Content-Encoding: gzip` names.
        self._zlib = zlib.compressobj(level, zlib.DEFLATED, 31)

    def feed(self, data: bytes) -> bytes:
        return self._zlib.compress(data)

    def sync(self) -> bytes:
        # zlib.h: Z_PARTIAL_FLUSH emits "enough bytes ... for the decompressor to finish the
        # block"; tests/core/compression/test_compressors.py proves every flush point decodable.
        return self._zlib.flush(zlib.Z_PARTIAL_FLUSH)

    def flush(self) -> bytes:
        return self._zlib.flush(zlib.Z_FINISH)


class BrotliCompressor:
    __slots__ = ("_brotli",)
    coding: Final = BR

    def __init__(
        self, quality: int = DEFAULT_LEVELS.brotli_quality, lgwin: int = DEFAULT_LEVELS.brotli_lgwin
    ) -> None:
        self._brotli = brotli.Compressor(mode=brotli.MODE_GENERIC, quality=quality, lgwin=lgwin)

    def feed(self, data: bytes) -> bytes:
        out: bytes = self._brotli.process(data)
        return out

    def sync(self) -> bytes:
        # BROTLI_OPERATION_FLUSH keeps the sliding window (the reference fork's v0.4.0 bug was
        # not the flush but a new compressor per chunk; interop.md §2.5).
        out: bytes = self._brotli.flush()
        return out

    def flush(self) -> bytes:
        out: bytes = self._brotli.finish()
        return out


class ZstdCompressor:
    __slots__ = ("_zstd",)
    coding: Final = ZSTD

    def __init__(
        self, dictionary: LoadedZstdDictionary | None, level: int = DEFAULT_LEVELS.zstd
    ) -> None:
        if dictionary is None:
            # RFC 8878's self-contained frames, which any client that lists zstd decodes.
            cctx = zstandard.ZstdCompressor(level=level)
        else:
            # A Codec stream: the dictionary is precomputed for its own level at load.
            cctx = zstandard.ZstdCompressor(level=dictionary.level, dict_data=dictionary.zstd_dict)
        self._zstd = cctx.compressobj()

    def feed(self, data: bytes) -> bytes:
        out: bytes = self._zstd.compress(data)
        return out

    def sync(self) -> bytes:
        out: bytes = self._zstd.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        return out

    def flush(self) -> bytes:
        out: bytes = self._zstd.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        return out


def new_compressor(
    coding: ContentCoding,
    dictionary: LoadedZstdDictionary | None = None,
    levels: CompressionLevels = DEFAULT_LEVELS,
) -> StreamCompressor:
    """A fresh compressor for one response (never shared: SEC-02 §4, codec-spec.md §10)."""
    if coding == GZIP:
        return GzipCompressor(levels.gzip)
    if coding == BR:
        return BrotliCompressor(levels.brotli_quality, levels.brotli_lgwin)
    if coding == ZSTD:
        # The spec allows zstd for Codec only with the format's dictionary (codec-spec.md §5,
        # MUST NOT otherwise).
        if dictionary is None:
            raise ValueError("zstd needs the wire format's dictionary (codec-spec.md §5)")
        return ZstdCompressor(dictionary)
    return IdentityCompressor()


def plain_compressor(
    coding: ContentCoding, levels: CompressionLevels = DEFAULT_LEVELS
) -> StreamCompressor:
    """A fresh compressor for one JSON response: zstd without a dictionary, the coding
    `Content-Encoding: zstd` names for any HTTP client (proxy/core/http/json_coding.py)."""
    if coding == ZSTD:
        return ZstdCompressor(None, levels.zstd)
    return new_compressor(coding, levels=levels)
