"""Streaming decompressors: what the proxy's own compressors wrote comes back whole, at every
split of the wire bytes, and every sync-flushed frame is out as soon as its bytes are in."""

from __future__ import annotations

import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.decompressors import (
    DEFAULT_MAX_BYTES,
    PIECE_BYTES,
    DecompressionError,
    StreamDecompressor,
    new_decompressor,
)
from proxy.core.compression.dictionaries import LoadedZstdDictionary
from proxy.core.http.content_coding import ContentCoding
from tests.compression_support import CODINGS, shipped_dictionaries


def shipped_dictionary() -> LoadedZstdDictionary:
    dictionary = shipped_dictionaries().for_format("msgpack")
    assert dictionary is not None
    return dictionary


DICTIONARY = shipped_dictionary()


def compressed(coding: str, parts: list[bytes]) -> tuple[bytes, list[int]]:
    """The wire bytes of `parts`, each sync-flushed, and where each part's bytes end on it."""
    compressor = new_compressor(coding, DICTIONARY if coding == "zstd" else None)  # type: ignore[arg-type]
    wire = b""
    ends = []
    for part in parts:
        wire += compressor.feed(part) + compressor.sync()
        ends.append(len(wire))
    return wire + compressor.flush(), ends


def decompressor(coding: str, max_bytes: int = DEFAULT_MAX_BYTES) -> StreamDecompressor:
    dictionary = DICTIONARY.data if coding == "zstd" else None
    return new_decompressor(coding, dictionary, max_bytes=max_bytes)


PARTS = [b"\x82\xa3ids\x91\xcd%\xeb\xa4done\xc2", b"hello " * 40, b"", bytes(range(256))]


@pytest.mark.parametrize("coding", CODINGS)
def test_every_split_point_gives_the_bytes_back(coding: ContentCoding) -> None:
    wire, _ = compressed(coding, PARTS)
    for cut in range(len(wire) + 1):
        d = decompressor(coding)
        assert d.coding == coding
        assert d.feed(wire[:cut]) + d.feed(wire[cut:]) == b"".join(PARTS), cut
        d.flush()


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=40)
@given(
    parts=st.lists(st.binary(max_size=300), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=10),
)
def test_a_sync_flushed_part_is_out_once_its_bytes_are_in(
    coding: str, parts: list[bytes], cuts: list[int]
) -> None:
    wire, ends = compressed(coding, parts)
    d = decompressor(coding)
    out = b""
    position = 0
    for cut in sorted({min(cut, len(wire)) for cut in cuts} | set(ends) | {len(wire)}):
        out += d.feed(wire[position:cut])
        position = cut
        complete = sum(1 for end in ends if end <= cut)
        assert out.startswith(b"".join(parts[:complete]))
    d.flush()
    assert out == b"".join(parts)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_cut_stream_fails_at_its_end(coding: str) -> None:
    wire, _ = compressed(coding, PARTS)
    d = decompressor(coding)
    d.feed(wire[:-1])
    with pytest.raises(DecompressionError, match="cut before its end"):
        d.flush()


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_bytes_after_the_end_fail(coding: str) -> None:
    wire, _ = compressed(coding, PARTS)
    d = decompressor(coding)
    # In the same read as the end, brotli's own decoder refuses them first.
    with pytest.raises(DecompressionError, match=r"after the end|not valid br"):
        d.feed(wire + b"\x00")
    d = decompressor(coding)
    d.feed(wire)
    with pytest.raises(DecompressionError, match="after the end"):
        d.feed(b"\x00")


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_bytes_that_are_not_the_coding_fail(coding: str) -> None:
    with pytest.raises(DecompressionError, match=f"not valid {coding}") as caught:
        decompressor(coding).feed(b"this is not compressed at all" * 4)
    assert caught.value.status_hint == 502


def test_zstd_needs_the_dictionary_it_was_written_with() -> None:
    wire, _ = compressed("zstd", PARTS)
    with pytest.raises(DecompressionError, match="dictionary"):
        new_decompressor("zstd")
    other = zstandard.train_dictionary(1024, [bytes([n]) * 64 + b"%d" % n for n in range(200)])
    with pytest.raises(DecompressionError, match="not valid zstd"):
        new_decompressor("zstd", other.as_bytes()).feed(wire)


def test_the_standard_libraries_streams_decode_too() -> None:
    data = b"frames " * 100
    gzip = zlib.compressobj(wbits=31)
    assert new_decompressor("x-gzip").feed(gzip.compress(data) + gzip.flush()) == data
    assert new_decompressor(" BR ").feed(brotli.compress(data)) == data
    assert new_decompressor(None).feed(data) == data
    assert new_decompressor("identity").feed(data) == data


def test_a_coding_it_does_not_know_fails() -> None:
    with pytest.raises(DecompressionError, match="'deflate'") as caught:
        new_decompressor("deflate")
    assert caught.value.code == "unsupported_content_encoding"


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_decompression_bomb_is_refused_before_its_output_exists(coding: str) -> None:
    # A few KiB that decode to 64 MiB: refused once the stream's cap is passed, and no call
    # ever holds more than the cap (the decoders are driven with an output limit).
    cap = 1 << 20
    bomb, _ = compressed(coding, [b"\x00" * (64 << 20)])
    assert len(bomb) < 256 << 10
    unpacker = decompressor(coding, max_bytes=cap)

    def feed_all() -> None:
        for start in range(0, len(bomb), 4096):
            unpacker.feed(bomb[start : start + 4096])

    with pytest.raises(DecompressionError) as refused:
        feed_all()
    assert refused.value.code == "decompressed_too_large"


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_stream_right_at_its_cap_decodes_whole(coding: str) -> None:
    cap = 1 << 16
    data = bytes(range(256)) * (cap // 256)
    unpacker = decompressor(coding, max_bytes=cap)
    stream, _ = compressed(coding, [data])
    out = b"".join(unpacker.feed(stream[i : i + 1000]) for i in range(0, len(stream), 1000))
    unpacker.flush()
    assert out == data


@pytest.mark.parametrize("coding", CODINGS)
def test_pieces_are_the_bytes_a_piece_at_a_time(coding: str) -> None:
    # Output that comes out of little input (zeros), and that does not (random-looking bytes):
    # either way no piece is much over PIECE_BYTES, and the pieces are the bytes.
    data = bytes(8 * PIECE_BYTES) + bytes(range(256)) * 2000 + bytes(3 * PIECE_BYTES)
    wire, _ = compressed(coding, [data])
    for step in (len(wire), 1000):
        unpacker = decompressor(coding)
        pieces = [
            piece
            for at in range(0, len(wire), step)
            for piece in unpacker.pieces(wire[at : at + step])
        ]
        unpacker.flush()
        assert b"".join(pieces) == data
        # brotli's output limit overshoots by half again; a zstd step holds up to 16 blocks.
        largest = 16 * 128 * 1024 if coding == "zstd" else 2 * PIECE_BYTES
        assert max(map(len, pieces)) <= (len(data) if coding == "identity" else largest)


@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_a_piece_is_decoded_only_when_asked_for(coding: str) -> None:
    bomb, _ = compressed(coding, [b"\x00" * (64 << 20)])
    pieces = decompressor(coding).pieces(bomb)
    assert len(next(pieces)) <= 2 * PIECE_BYTES  # and the other 64 MiB never exist
