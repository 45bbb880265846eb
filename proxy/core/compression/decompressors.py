"""Streaming decompressors: a Codec response's content coding undone as its bytes arrive.

The client side of compressors.py, for whoever reads a Codec body: the OpenAI SDK transport
(proxy/sdk/) and the renderer's body (proxy/core/render/body.py). A generic HTTP client cannot
do it for them: dictionary zstd decodes only with the dictionary `Codec-Zstd-Dict` names
(codec-spec.md §5), and httpx fails such a stream with "Dictionary mismatch" (interop.md §1.3).

`feed` returns what the bytes so far decode to: a server that sync-flushes after a frame (as
this proxy does, compressors.py) lets every frame out at once. `pieces` gives the same bytes a
piece at a time, each of about `PIECE_BYTES` at most, decoding the next only when asked: a
reader that checks each piece as it comes (a frame decoder and its frame cap) stops a bomb
after the piece that gave it away, not after the whole budget. `flush` checks that the stream
ended where the coding says it ends; a cut stream, bytes after the end, or bytes that are not
the coding raise `DecompressionError`.

A peer's compressed body is never trusted to stay small (SEC-02 §3, "reject, don't
truncate"): no more than `max_bytes` of output ever exists for one stream, and no single call
is asked for "everything" — gzip and brotli are driven with an output limit, zstd is fed a few
bytes at a time (a zstd block decodes to at most 128 KiB, and takes at least 4 bytes).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final, Protocol

import brotli
import zstandard

from proxy.core.errors import UpstreamProtocolError
from proxy.core.http.content_coding import BR, CODING_ALIASES, GZIP, IDENTITY, ZSTD, ContentCoding
from proxy.core.shown import clipped, quoted

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PIECE_BYTES",
    "DecompressionError",
    "StreamDecompressor",
    "new_decompressor",
]


class DecompressionError(UpstreamProtocolError):
    """A response body that is not what its `Content-Encoding` says (502: the peer sent it)."""


class StreamDecompressor(Protocol):
    @property
    def coding(self) -> ContentCoding: ...

    def feed(self, data: bytes) -> bytes: ...

    def pieces(self, data: bytes) -> Iterator[bytes]: ...

    def flush(self) -> None: ...


# A Codec stream is a few bytes per token: 64 MiB is millions of tokens, far past any answer.
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
# What one piece decodes to, about (brotli's output limit overshoots by up to half again; a zstd
# step is at most 16 blocks of 128 KiB).
PIECE_BYTES: Final = 64 * 1024
# zstd input per decompress call: at most 16 blocks of 128 KiB can come out of it.
_ZSTD_STEP: Final = 64


def _too_large(max_bytes: int) -> DecompressionError:
    return DecompressionError(
        f"response body decodes to more than {max_bytes} bytes", code="decompressed_too_large"
    )


class _Budget:
    """What one stream may still decode to."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def spend(self, out: bytes) -> bytes:
        self.left -= len(out)
        if self.left < 0:
            raise _too_large(self.limit)
        return out


def _corrupt(coding: str, detail: object) -> DecompressionError:
    return DecompressionError(
        f"response body is not valid {coding}: {clipped(str(detail))}", code="bad_coding"
    )


class IdentityDecompressor:
    __slots__ = ()
    coding: Final = IDENTITY

    def feed(self, data: bytes) -> bytes:
        return data

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def flush(self) -> None:
        return None


class GzipDecompressor:
    __slots__ = ("_budget", "_zlib")
    coding: Final = GZIP

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._zlib = zlib.decompressobj(wbits=31)
        self._budget = _Budget(max_bytes)

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        decoder, budget = self._zlib, self._budget
        if decoder.eof:
            if data:
                raise _corrupt(GZIP, "bytes after the end of the gzip stream")
            return
        try:
            while True:
                # max_length bounds this call; the rest waits in unconsumed_tail, or in zlib
                # when a full piece used all the input.
                step = min(PIECE_BYTES, budget.left + 1)
                out = decoder.decompress(data, step)
                data = decoder.unconsumed_tail
                if out:
                    yield budget.spend(out)
                if (not data and len(out) < step) or decoder.eof:
                    break
        except zlib.error as exc:
            raise _corrupt(GZIP, exc) from exc
        if decoder.unused_data:
            # One member: our compressor writes one per response (RFC 1952 allows several,
            # but a Codec body that is several gzip streams was not written by one compressor).
            raise _corrupt(GZIP, "bytes after the end of the gzip stream")

    def flush(self) -> None:
        if not self._zlib.eof:
            raise _corrupt(GZIP, "the stream was cut before its end")


class BrotliDecompressor:
    __slots__ = ("_brotli", "_budget")
    coding: Final = BR

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._brotli = brotli.Decompressor()
        self._budget = _Budget(max_bytes)

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        decoder, budget = self._brotli, self._budget
        if decoder.is_finished():
            raise _corrupt(BR, "bytes after the end of the brotli stream")
        try:
            out = decoder.process(data, output_buffer_limit=min(PIECE_BYTES, budget.left + 1))
            # With the output limit hit, brotli keeps the rest of the input; it is drained with
            # empty input until nothing more comes out (`can_accept_more_data` says True before).
            while out:
                yield budget.spend(out)
                if decoder.is_finished():
                    break
                out = decoder.process(b"", output_buffer_limit=min(PIECE_BYTES, budget.left + 1))
        except brotli.error as exc:
            raise _corrupt(BR, exc) from exc

    def flush(self) -> None:
        if not self._brotli.is_finished():
            raise _corrupt(BR, "the stream was cut before its end")


class ZstdDecompressor:
    __slots__ = ("_budget", "_zstd")
    coding: Final = ZSTD

    def __init__(self, dictionary: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        zdict = zstandard.ZstdCompressionDict(dictionary)
        # The window a frame may demand is allocated before any output: bounded by the cap,
        # but never below 8 MiB (what a compressor at our levels asks for) nor above zstd's own
        # default of 128 MiB.
        window = 1 << max(23, min(27, (max_bytes - 1).bit_length()))
        decoder = zstandard.ZstdDecompressor(dict_data=zdict, max_window_size=window)
        self._zstd = decoder.decompressobj()
        self._budget = _Budget(max_bytes)

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        decoder, budget = self._zstd, self._budget
        if decoder.eof:
            raise _corrupt(ZSTD, "bytes after the end of the zstd frame")
        fed = 0
        try:
            while fed < len(data) and not decoder.eof:
                out = decoder.decompress(data[fed : fed + _ZSTD_STEP])
                fed += _ZSTD_STEP
                if out:
                    yield budget.spend(out)
        except zstandard.ZstdError as exc:
            if "too much memory" in str(exc):
                raise _too_large(budget.limit) from exc
            raise _corrupt(ZSTD, exc) from exc
        if decoder.unused_data or fed < len(data):
            raise _corrupt(ZSTD, "bytes after the end of the zstd frame")

    def flush(self) -> None:
        if not self._zstd.eof:
            raise _corrupt(ZSTD, "the stream was cut before its end")


def new_decompressor(
    content_encoding: str | None,
    zstd_dictionary: bytes | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
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
        return GzipDecompressor(max_bytes)
    if name == BR:
        return BrotliDecompressor(max_bytes)
    if name == ZSTD:
        if zstd_dictionary is None:
            raise DecompressionError(
                "a zstd Codec response decodes only with the dictionary it names",
                code="zstd_dictionary_missing",
            )
        return ZstdDecompressor(zstd_dictionary, max_bytes)
    raise DecompressionError(
        f"response Content-Encoding {quoted(content_encoding or '')} is not one we decode",
        code="unsupported_content_encoding",
    )
