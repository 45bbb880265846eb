"""The event writer: whole events in, compressed bytes out on the flush schedule, time passed in.

Driven as the edge drives it (feed at each read's time, `on_deadline` once `deadline()` has
passed without a read): at every point the client decodes whole events only, the first at once,
none waiting past its deadline or behind `max_frames` others, and the whole body decodes to the
events fed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.compression.compressors import plain_compressor
from proxy.core.compression.event_writer import EventWriter
from proxy.core.compression.flush import FlushConfig
from proxy.core.http.content_coding import ContentCoding
from tests.compression_support import CODINGS, decompress_whole, incremental_decompressor

event = st.binary(max_size=40).map(lambda data: b"data: " + data.replace(b"\n", b" ") + b"\n\n")
# A stream: reads, each with the time since the previous one and the whole events it brought.
reads = st.lists(
    st.tuples(st.floats(min_value=0, max_value=0.12), st.lists(event, max_size=3)),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=60)
@given(
    stream=reads,
    interval_ms=st.sampled_from([0, 10, 50]),
    max_frames=st.integers(min_value=0, max_value=6),
)
def test_every_flush_point_delivers_whole_events_when_due(
    coding: ContentCoding,
    stream: list[tuple[float, list[bytes]]],
    interval_ms: int,
    max_frames: int,
) -> None:
    config = FlushConfig(interval_ms, max_frames)
    writer = EventWriter(plain_compressor(coding), config)
    decompress = incremental_decompressor(coding)
    fed: list[tuple[float, bytes]] = []  # when each event was fed
    wire = decoded = b""
    now = 0.0

    def receive(data: bytes) -> None:
        nonlocal wire, decoded
        wire += data
        if data:  # a zstd decompressor refuses input after the end of its frame
            decoded += decompress(data)
        # Whole events only, in order: the client never holds half of one.
        assert b"".join(e for _, e in fed).startswith(decoded)
        assert decoded in {b"".join(e for _, e in fed[:k]) for k in range(len(fed) + 1)}

    for gap, events in stream:
        deadline = writer.deadline()
        if deadline is not None and now + gap >= deadline:
            receive(writer.on_deadline(deadline))
            assert writer.deadline() is None
        now += gap
        first = not fed
        fed += [(now, e) for e in events]
        receive(writer.feed(b"".join(events), len(events), now))
        if first and events:
            assert decoded.startswith(events[0])  # the first event at once
        waiting = fed[_events_in(decoded, fed) :]
        if config.every_frame:
            assert waiting == []
        elif waiting:
            assert now - waiting[0][0] < interval_ms / 1000
            assert len(waiting) < max_frames
    receive(writer.flush())
    assert writer.finished
    assert decoded == b"".join(e for _, e in fed)
    assert decompress_whole(coding, wire) == decoded


def _events_in(decoded: bytes, fed: list[tuple[float, bytes]]) -> int:
    size = 0
    for count, (_, event) in enumerate(fed):
        if size == len(decoded):
            return count
        size += len(event)
    return len(fed)


def test_the_first_event_goes_at_once_later_ones_wait_for_the_deadline() -> None:
    writer = EventWriter(plain_compressor("gzip"), FlushConfig(50, 32))
    decompress = incremental_decompressor("gzip")
    assert decompress(writer.feed(b"data: 1\n\n", 1, 0.0)) == b"data: 1\n\n"
    assert decompress(writer.feed(b"data: 2\n\n", 1, 0.010)) == b""
    assert decompress(writer.feed(b"data: 3\n\n", 1, 0.020)) == b""
    assert writer.deadline() == pytest.approx(0.060)
    assert writer.on_deadline(0.059) == b""  # an early wake-up sends nothing
    deadline = writer.deadline()
    assert deadline is not None
    assert decompress(writer.on_deadline(deadline)) == b"data: 2\n\ndata: 3\n\n"
    assert writer.deadline() is None


def test_a_piece_of_an_event_is_never_flushed_on_its_own() -> None:
    writer = EventWriter(plain_compressor("gzip"), FlushConfig(0, 0))  # every event flushed
    decompress = incremental_decompressor("gzip")
    assert decompress(writer.feed(b"data: 1\n\n", 1, 0.0)) == b"data: 1\n\n"
    assert decompress(writer.feed(b"data: a very long", 0, 0.1)) == b""
    assert writer.deadline() is None  # nothing is due: no event is pending
    assert decompress(writer.feed(b" one\n\n", 1, 0.2)) == b"data: a very long one\n\n"


def test_flush_ends_the_compressed_stream_once() -> None:
    writer = EventWriter(plain_compressor("br"), FlushConfig(50, 32))
    writer.feed(b"data: 1\n\n", 1, 0.0)
    writer.feed(b"data: 2\n\n", 1, 0.01)
    end = writer.flush()
    assert end
    assert writer.finished
    assert writer.deadline() is None
    assert writer.flush() == b""
