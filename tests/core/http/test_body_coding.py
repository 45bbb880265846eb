"""Compressed request bodies: decoded exactly, capped without allocating past the cap."""

from __future__ import annotations

import gzip
import tracemalloc
from collections.abc import Callable

import brotli
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from proxy.core.http.body_coding import decode_body, request_codings

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


@pytest.mark.parametrize("coding", sorted(COMPRESS))
@given(body=st.binary(max_size=5000))
def test_round_trip(coding: str, body: bytes) -> None:
    assert decode_body(COMPRESS[coding](body), coding, max_bytes=5000) == body


@pytest.mark.parametrize("coding", sorted(COMPRESS))
def test_exactly_at_the_cap_is_accepted_one_byte_over_is_413(coding: str) -> None:
    body = b'{"prompt": "x"}' * 100
    assert decode_body(COMPRESS[coding](body), coding, max_bytes=len(body)) == body
    with pytest.raises(PayloadTooLarge) as caught:
        decode_body(COMPRESS[coding](body), coding, max_bytes=len(body) - 1)
    assert caught.value.status_hint == 413


BOMB_BYTES = 256 << 20  # 256 MiB of zeros: a few hundred KiB compressed, less for br/zstd
CAP = 1 << 20


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    zeros = bytes(BOMB_BYTES)
    return {
        "gzip": gzip.compress(zeros, compresslevel=9),
        "br": brotli.compress(zeros, quality=5),
        # Without a declared size, so only the running count can stop it.
        "zstd": zstandard.ZstdCompressor(write_content_size=False).compress(zeros),
        "zstd-sized": zstandard.ZstdCompressor().compress(zeros),
    }


@pytest.mark.parametrize("name", ["gzip", "br", "zstd", "zstd-sized"])
def test_decompression_bomb_is_413_without_allocating_past_the_cap(
    bombs: dict[str, bytes], name: str
) -> None:
    coding = name.split("-")[0]
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            decode_body(bombs[name], coding, max_bytes=CAP)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The output buffer and one copy of it, never the 256 MiB the bomb holds.
    assert peak < 4 * CAP


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("gzip", gzip.compress(b"hello world" * 50)[:-9]),
        ("br", brotli.compress(b"hello world" * 50)[:-3]),
        ("zstd", zstandard.ZstdCompressor().compress(b"hello world" * 50)[:-3]),
        ("gzip", b"not gzip at all"),
        ("br", b"\xff\xff\xff not brotli"),
        ("zstd", b"not zstd"),
    ],
)
def test_corrupt_or_truncated_body_is_400(coding: str, body: bytes) -> None:
    with pytest.raises(BadRequest) as caught:
        decode_body(body, coding, max_bytes=CAP)
    assert caught.value.status_hint == 400
    assert coding in caught.value.message


@pytest.mark.parametrize("header", ["deflate", "compress", "gzip, lzma", "snappy"])
def test_unknown_coding_is_415(header: str) -> None:
    with pytest.raises(UnsupportedMediaType) as caught:
        decode_body(b"{}", header, max_bytes=CAP)
    assert caught.value.status_hint == 415


def test_codings_are_removed_in_reverse_order() -> None:
    body = b'{"prompt": "layers"}'
    layered = COMPRESS["br"](COMPRESS["gzip"](body))
    assert request_codings("gzip, br") == ["gzip", "br"]
    assert decode_body(layered, "GZIP , br", max_bytes=CAP) == body


@pytest.mark.parametrize("header", [None, "", "identity", "Identity"])
def test_identity_is_untouched(header: str | None) -> None:
    assert decode_body(b"raw", header, max_bytes=CAP) == b"raw"


def test_concatenated_gzip_members() -> None:
    assert decode_body(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", max_bytes=4) == b"abcd"
    with pytest.raises(PayloadTooLarge):
        decode_body(gzip.compress(b"ab") + gzip.compress(b"cde"), "gzip", max_bytes=4)
