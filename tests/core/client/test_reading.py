"""A body read whole is decoded within its bound as it arrives, and hashed as it comes."""

from __future__ import annotations

import hashlib
import tracemalloc
import zlib

import brotli
import pytest

from proxy.core.client.reading import MAX_ERROR_BYTES, BodyReader, BodyTooLarge, read_whole
from proxy.core.compression.decompressors import DecompressionError

DOCUMENT = b'{"id": "test/map", "vocab": {"a": 0}}' * 1000


def gzip(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def bomb(coding: str, size: int) -> bytes:
    """`size` zero bytes, compressed: kilobytes on the wire."""
    zeros = bytes(size)
    # Brotli at quality 4 packs them as tightly as at 11 (under 1 KB) in a fortieth of the time.
    return gzip(zeros) if coding == "gzip" else brotli.compress(zeros, quality=4)


@pytest.mark.parametrize("coding", [None, "identity", "gzip", "br"])
@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_a_body_reads_and_hashes_as_it_comes(coding: str | None, step: int) -> None:
    coded = {"gzip": gzip, "br": brotli.compress}.get(coding or "", lambda data: data)(DOCUMENT)
    reader = BodyReader(coding, len(DOCUMENT))
    for at in range(0, len(coded), step):
        reader.feed(coded[at : at + step])
    read = reader.flush()
    assert read.data == DOCUMENT
    assert read.sha256 == hashlib.sha256(DOCUMENT).hexdigest()
    assert read_whole(coded, coding, len(DOCUMENT)) == read


@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_a_bomb_is_refused_at_the_bound_never_decoded_whole(coding: str) -> None:
    wire = bomb(coding, 512 << 20)
    assert len(wire) < 600_000
    reader = BodyReader(coding, MAX_ERROR_BYTES)

    def read_all() -> None:
        for at in range(0, len(wire), 65536):
            reader.feed(wire[at : at + 65536])

    tracemalloc.start()
    try:
        with pytest.raises(DecompressionError, match=f"more than {MAX_ERROR_BYTES} bytes"):
            read_all()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the bound and a piece, where decoding it whole is 512 MiB


def test_the_coded_bytes_are_bounded_too() -> None:
    reader = BodyReader("identity", 10)
    reader.feed(b"0123456789")
    with pytest.raises(BodyTooLarge, match="over 10 bytes") as refused:
        reader.feed(b"!")
    assert refused.value.code == "body_too_large"
    assert refused.value.status_hint == 502
    # A gzip header's file name decodes to nothing, and is still counted.
    named = b"\x1f\x8b\x08\x08\x00\x00\x00\x00\x00\xff" + b"n" * 100
    with pytest.raises(BodyTooLarge):
        BodyReader("gzip", 64).feed(named)


@pytest.mark.parametrize(
    ("coding", "body", "message"),
    [
        ("gzip", b"not gzip", "not valid gzip"),
        ("gzip", gzip(DOCUMENT)[:-4], "cut before its end"),
        ("deflate", b"x", "is not one we decode"),
    ],
)
def test_a_body_not_in_the_coding_it_names(coding: str, body: bytes, message: str) -> None:
    with pytest.raises(DecompressionError, match=message):
        read_whole(body, coding, len(DOCUMENT))
