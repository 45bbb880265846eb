"""Decompress Codec responses with the standard libraries, incrementally, as a client does."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli
import zstandard

from proxy.core.compression.dictionaries import ZstdDictionaries
from proxy.dictionaries.load import load_dictionaries
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST

CODINGS = ("identity", "gzip", "br", "zstd")
FORMATS = ("msgpack", "protobuf")


def shipped_dictionaries() -> ZstdDictionaries:
    """The dictionaries in dictionaries/manifest.json, verified as the proxy verifies them."""
    return load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST, manifest_required=True)


def incremental_decompressor(
    coding: str, dictionary: bytes | None = None
) -> Callable[[bytes], bytes]:
    """Feed compressed bytes as they arrive; get the decompressed bytes they complete."""
    if coding == "gzip":
        return zlib.decompressobj(wbits=31).decompress
    if coding == "br":
        process: Callable[[bytes], bytes] = brotli.Decompressor().process
        return process
    if coding == "zstd":
        assert dictionary is not None, "zstd responses need the dictionary"
        zdict = zstandard.ZstdCompressionDict(dictionary)
        decompress: Callable[[bytes], bytes] = (
            zstandard.ZstdDecompressor(dict_data=zdict).decompressobj().decompress
        )
        return decompress
    assert coding == "identity", coding
    return bytes


def decompress_whole(coding: str, body: bytes, dictionary: bytes | None = None) -> bytes:
    """The standard libraries' one-shot decoders (they also check the stream is complete)."""
    if coding == "gzip":
        return zlib.decompress(body, wbits=31)
    if coding == "br":
        out: bytes = brotli.decompress(body)
        return out
    if coding == "zstd":
        assert dictionary is not None
        zdict = zstandard.ZstdCompressionDict(dictionary)
        with zstandard.ZstdDecompressor(dict_data=zdict).stream_reader(body) as reader:
            whole: bytes = reader.read()
        return whole
    return body
