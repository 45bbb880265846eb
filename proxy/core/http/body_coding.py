"""Request bodies sent with `Content-Encoding`: decoded with a hard cap on the decoded size.

The spec only shows `Content-Encoding: gzip` as an optional request coding (codec-spec.md §5,
§11.17); we accept gzip, br and zstd. A decompression bomb (SEC-02 §3, SEC-07 #5: "reject,
don't truncate") gets 413 before more than `max_bytes` (+1) of output exists: every decoder is
driven with an output limit, never asked for "everything". Unknown codings get 415.
"""

from __future__ import annotations

import zlib
from typing import Final

import brotli
import zstandard

from proxy.core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from proxy.core.http.content_coding import CODING_ALIASES
from proxy.core.shown import quoted

REQUEST_CODINGS: Final = ("gzip", "br", "zstd")


def request_codings(content_encoding: str | None) -> list[str]:
    """The codings applied to a body, in the order they were applied (RFC 9110 §8.4)."""
    if content_encoding is None:
        return []
    codings = []
    for item in content_encoding.split(","):
        coding = item.strip().lower()
        if coding in ("", "identity"):
            continue
        coding = CODING_ALIASES.get(coding, coding)
        if coding not in REQUEST_CODINGS:
            raise UnsupportedMediaType(
                f"request Content-Encoding {quoted(item.strip())} is not supported; "
                f"supported: {', '.join(REQUEST_CODINGS)}",
                code="unsupported_content_encoding",
            )
        codings.append(coding)
    return codings


def decode_body(raw: bytes, content_encoding: str | None, *, max_bytes: int) -> bytes:
    """The body with its content codings removed; 413 past `max_bytes`, 400 if corrupt."""
    body = raw
    # Codings are listed in the order applied, so they are removed in reverse.
    for coding in reversed(request_codings(content_encoding)):
        body = _DECODERS[coding](body, max_bytes)
    return body


def _too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds {max_bytes} bytes once decompressed", code="body_too_large"
    )


def _corrupt(coding: str, detail: object) -> BadRequest:
    return BadRequest(f"request body is not valid {coding}: {detail}", code="invalid_body_encoding")


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    out = bytearray()
    pending = data
    while True:  # one gzip member per round: RFC 1952 allows several, concatenated
        decoder = zlib.decompressobj(wbits=31)
        try:
            while pending:
                # max_length bounds what this call may produce; the rest waits in
                # unconsumed_tail, so the cap holds however well the input compresses.
                out += decoder.decompress(pending, max_bytes + 1 - len(out))
                if len(out) > max_bytes:
                    raise _too_large(max_bytes)
                pending = decoder.unconsumed_tail
                if decoder.eof:
                    break
        except zlib.error as exc:
            raise _corrupt("gzip", exc) from exc
        if not decoder.eof:
            raise _corrupt("gzip", "truncated")
        pending = decoder.unused_data
        if not pending:
            return bytes(out)


def _unbrotli(data: bytes, max_bytes: int) -> bytes:
    out = bytearray()
    decoder = brotli.Decompressor()
    try:
        chunk = decoder.process(data, output_buffer_limit=max_bytes + 1)
        while True:
            out += chunk
            if len(out) > max_bytes:
                raise _too_large(max_bytes)
            # With the output limit hit, brotli keeps the rest; it is drained with empty input.
            if decoder.is_finished() or decoder.can_accept_more_data():
                break
            chunk = decoder.process(b"", output_buffer_limit=max_bytes + 1 - len(out))
    except brotli.error as exc:
        raise _corrupt("br", exc) from exc
    if not decoder.is_finished():
        raise _corrupt("br", "truncated")
    return bytes(out)


def _unzstd(data: bytes, max_bytes: int) -> bytes:
    # The window a frame may demand is allocated before any output: bound it by the cap too
    # (the smallest power of two >= the cap; zstd's own floor is 1 KiB).
    window = 1 << max(10, (max_bytes - 1).bit_length())
    decoder = zstandard.ZstdDecompressor(max_window_size=window)
    out = bytearray()
    try:
        params = zstandard.get_frame_parameters(data)
        if params.content_size != zstandard.CONTENTSIZE_UNKNOWN and params.content_size > max_bytes:
            raise _too_large(max_bytes)
        # Pass 1, bounded: read() never returns more than asked, so the cap holds.
        with decoder.stream_reader(data, read_across_frames=True) as reader:
            while chunk := reader.read(max_bytes + 1 - len(out)):
                out += chunk
                if len(out) > max_bytes:
                    raise _too_large(max_bytes)
        # Pass 2: the reader ends quietly on a truncated frame; decompressobj reports `eof`.
        # Its output is the same bytes pass 1 already bounded.
        _check_complete_zstd(decoder, data)
    except zstandard.ZstdError as exc:
        if "too much memory" in str(exc):
            raise _too_large(max_bytes) from exc
        raise _corrupt("zstd", exc) from exc
    return bytes(out)


def _check_complete_zstd(decoder: zstandard.ZstdDecompressor, data: bytes) -> None:
    pending = data
    while pending:
        frame = decoder.decompressobj()
        frame.decompress(pending)
        if not frame.eof:
            raise _corrupt("zstd", "truncated")
        pending = frame.unused_data


_DECODERS: Final = {"gzip": _gunzip, "br": _unbrotli, "zstd": _unzstd}
