"""Streaming compressors: the standard libraries recover the identity bytes exactly, and every
flush leaves the client able to decode every frame sent so far (incremental decodability)."""

from __future__ import annotations

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.compression.compressors import new_compressor, plain_compressor
from proxy.core.compression.dictionaries import LoadedZstdDictionary, ZstdDictionaries
from proxy.core.http.content_coding import ContentCoding
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame, encoder_for
from tests.compression_support import (
    CODINGS,
    FORMATS,
    decompress_whole,
    incremental_decompressor,
    shipped_dictionaries,
)

DICTIONARIES: ZstdDictionaries = shipped_dictionaries()


def dictionary_for(fmt: str) -> LoadedZstdDictionary:
    dictionary = DICTIONARIES.for_format(fmt)
    assert dictionary is not None, f"no shipped {fmt} dictionary"
    return dictionary


token_ids = st.integers(min_value=0, max_value=49151) | st.integers(0, 0xFFFFFFFF)
frame_ids = st.lists(token_ids, min_size=1, max_size=12).map(tuple)
# A stream: frames, each with whether a flush follows it.
streams = st.lists(st.tuples(frame_ids, st.booleans()), min_size=1, max_size=80)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", CODINGS)
@given(stream=streams, finish_reason=st.sampled_from(["length", "eos_token", "error"]))
def test_every_flush_point_decodes_to_whole_frames(
    fmt: str, coding: ContentCoding, stream: list[tuple[tuple[int, ...], bool]], finish_reason: str
) -> None:
    encoder = encoder_for(fmt)
    dictionary = dictionary_for(fmt) if coding == "zstd" else None
    compressor = new_compressor(coding, dictionary)
    assert compressor.coding == coding
    decompress = incremental_decompressor(coding, dictionary.data if dictionary else None)
    decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
    frames = [Frame(ids) for ids, _ in stream] + [Frame((), True, finish_reason)]
    flush_after = [flush for _, flush in stream] + [True]
    identity = b""
    wire = b""
    decoded: list[Frame] = []
    for fed, (frame, flush) in enumerate(zip(frames, flush_after, strict=True), start=1):
        encoded = encoder.encode(frame)
        identity += encoded
        sent = compressor.feed(encoded)
        if frame.done:
            sent += compressor.flush()
        elif flush:
            sent += compressor.sync()
        wire += sent
        decoded += decoder.feed(decompress(sent))
        if flush:
            # Everything fed so far is decodable now, as whole frames, nothing held back.
            assert decoded == frames[:fed]
    decoder.flush()
    assert decompress_whole(coding, wire, dictionary.data if dictionary else None) == identity


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_one_context_per_stream_compresses_across_frames(fmt: str, coding: ContentCoding) -> None:
    """Later flushes reuse the window: a repeated frame costs far less the second time."""
    encoder = encoder_for(fmt)
    compressor = new_compressor(coding, dictionary_for(fmt) if coding == "zstd" else None)
    frame = encoder.encode(Frame((1234, 40000, 7, 99, 31000, 5)))
    first = len(compressor.feed(frame) + compressor.sync())
    again = len(compressor.feed(frame) + compressor.sync())
    assert again < first
    assert again < len(frame)


def test_identity_is_the_bytes_themselves() -> None:
    compressor = new_compressor("identity")
    assert compressor.feed(b"abc") == b"abc"
    assert compressor.sync() == b""
    assert compressor.flush() == b""


def test_zstd_without_a_dictionary_is_refused() -> None:
    with pytest.raises(ValueError, match="dictionary"):
        new_compressor("zstd")


@pytest.mark.parametrize("fmt", FORMATS)
def test_zstd_frames_name_the_dictionary(fmt: str) -> None:
    dictionary = dictionary_for(fmt)
    compressor = new_compressor("zstd", dictionary)
    wire = compressor.feed(encoder_for(fmt).encode(Frame((1,)))) + compressor.flush()
    trained_id = zstandard.ZstdCompressionDict(dictionary.data).dict_id()
    assert zstandard.get_frame_parameters(wire).dict_id == trained_id


@pytest.mark.parametrize("coding", CODINGS)
@given(pieces=st.lists(st.tuples(st.binary(max_size=300), st.booleans()), max_size=40))
def test_a_plain_compressor_decodes_without_anything_else_at_every_flush(
    coding: ContentCoding, pieces: list[tuple[bytes, bool]]
) -> None:
    # JSON responses: a client that lists the coding holds no dictionary of ours.
    compressor = plain_compressor(coding)
    assert compressor.coding == coding
    decompress = incremental_decompressor(coding)
    fed = wire = decoded = b""
    for data, sync in pieces:
        fed += data
        sent = compressor.feed(data) + (compressor.sync() if sync else b"")
        wire += sent
        decoded += decompress(sent)
        if sync:
            assert decoded == fed
    wire += compressor.flush()
    assert decompress_whole(coding, wire) == fed


def test_plain_zstd_names_no_dictionary_and_says_it_is_complete() -> None:
    compressor = plain_compressor("zstd")
    whole = compressor.feed(b'data: {"a": 1}\n\n') + compressor.flush()
    assert zstandard.get_frame_parameters(whole).dict_id == 0
    # A streaming decoder ends the frame: the end of the body is the end of the stream.
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    assert decompressor.decompress(whole) == b'data: {"a": 1}\n\n'
    assert decompressor.eof
