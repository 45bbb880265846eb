"""The body writer: frames in, bytes out on the flush schedule, time passed in.

Driven as the edge drives it (feed at each read's time, `on_deadline` once `deadline()` has
passed without a read), at every flush point the client can decode every frame the schedule
says is due, no frame waits past its deadline, and the whole body decodes to the frames fed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter, flush_config_for
from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.flush import FlushConfig, merge_frames
from proxy.core.http.content_coding import ContentCoding
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame, encoder_for
from tests.compression_support import CODINGS, FORMATS, incremental_decompressor
from tests.core.compression.test_compressors import dictionary_for

frame_ids = st.lists(st.integers(min_value=0, max_value=49151), min_size=1, max_size=4)
# A stream: reads, each with the time since the previous one and the frames it produced.
reads = st.lists(
    st.tuples(st.floats(min_value=0, max_value=0.12), st.lists(frame_ids, max_size=3)),
    min_size=1,
    max_size=40,
)


def _writer(fmt: str, coding: ContentCoding, config: FlushConfig) -> BodyWriter:
    dictionary = dictionary_for(fmt) if coding == "zstd" else None
    return BodyWriter(encoder_for(fmt), new_compressor(coding, dictionary), config)


def _ids(frames: list[Frame]) -> list[int]:
    return [token for frame in frames for token in frame.ids]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=40)
@given(
    stream=reads,
    interval_ms=st.sampled_from([0, 10, 50]),
    max_frames=st.integers(min_value=0, max_value=6),
    merge=st.booleans(),
)
def test_every_flush_point_delivers_what_is_due(
    fmt: str,
    coding: ContentCoding,
    stream: list[tuple[float, list[list[int]]]],
    interval_ms: int,
    max_frames: int,
    merge: bool,
) -> None:
    config = FlushConfig(interval_ms, max_frames, merge=merge)
    writer = _writer(fmt, coding, config)
    dictionary = dictionary_for(fmt).data if coding == "zstd" else None
    decompress = incremental_decompressor(coding, dictionary)
    decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
    decoded: list[Frame] = []
    fed: list[tuple[float, Frame]] = []  # when each frame was fed
    now = 0.0

    def receive(data: bytes) -> None:
        if data:  # a zstd decompressor refuses input after the end of its frame
            decoded.extend(decoder.feed(decompress(data)))

    for gap, batch in stream:
        # The edge reads with the writer's deadline: if it passes first, it flushes then.
        deadline = writer.deadline()
        if deadline is not None and now + gap >= deadline:
            receive(writer.on_deadline(deadline))
            assert writer.deadline() is None
        now += gap
        frames = [Frame(tuple(ids)) for ids in batch]
        fed += [(now, frame) for frame in frames]
        receive(writer.feed(frames, now))
        # Whatever the client cannot decode yet arrived within the interval, and fewer than
        # `max_frames` frames are waiting.
        received = len(_ids(decoded))
        waiting = [(t, frame) for t, frame in fed if (received := received - len(frame.ids)) < 0]
        if config.every_frame:
            assert waiting == []
        elif waiting:
            assert now - waiting[0][0] < interval_ms / 1000
            assert len(waiting) < max_frames
    terminal = Frame((), True, "length")
    receive(writer.feed([terminal], now))
    assert writer.finished
    receive(writer.flush())
    decoder.flush()
    assert _ids(decoded) == _ids([frame for _, frame in fed])
    assert [frame for frame in decoded if frame.done] == [terminal]
    assert decoded[-1] == terminal
    if not merge:
        assert decoded == [frame for _, frame in fed] + [terminal]


@pytest.mark.parametrize("fmt", FORMATS)
def test_identity_writes_each_read_at_once_frame_by_frame(fmt: str) -> None:
    encoder = encoder_for(fmt)
    writer = BodyWriter(encoder, new_compressor("identity"), IDENTITY_FLUSH)
    first = [Frame((1,)), Frame((2, 3))]
    assert writer.feed(first, 0.0) == b"".join(map(encoder.encode, first))
    assert writer.deadline() is None
    assert writer.feed([], 1.0) == b""
    last = Frame((4,), True, "length")
    assert writer.feed([last], 2.0) == encoder.encode(last)
    assert writer.flush() == b""


def test_the_first_frame_goes_at_once_later_ones_wait_for_the_deadline() -> None:
    encoder = encoder_for("msgpack")
    writer = _writer("msgpack", "gzip", FlushConfig(50, 32))
    decompress = incremental_decompressor("gzip")
    assert decompress(writer.feed([Frame((1,))], 0.0)) == encoder.encode(Frame((1,)))
    assert writer.feed([Frame((2,))], 0.010) == b""
    assert writer.feed([Frame((3,))], 0.020) == b""
    assert writer.deadline() == pytest.approx(0.060)
    assert writer.on_deadline(0.059) == b""  # an early wake-up sends nothing
    merged = merge_frames([Frame((2,)), Frame((3,))])
    deadline = writer.deadline()
    assert deadline is not None
    assert decompress(writer.on_deadline(deadline)) == b"".join(map(encoder.encode, merged))
    assert writer.deadline() is None


def test_flush_ends_the_compressed_stream_once() -> None:
    writer = _writer("msgpack", "gzip", FlushConfig(50, 32))
    writer.feed([Frame((1,))], 0.0)
    writer.feed([Frame((2,))], 0.01)
    end = writer.flush()
    assert end  # the pending frame and the gzip trailer
    assert writer.finished
    assert writer.flush() == b""


@pytest.mark.parametrize("coding", CODINGS)
def test_each_coding_has_one_schedule(coding: str) -> None:
    # The one the server sends it on and bench/compression.py measures the coding table on.
    configured = FlushConfig(50.0, 32)
    expected = IDENTITY_FLUSH if coding == "identity" else configured
    assert flush_config_for(coding, configured) == expected
