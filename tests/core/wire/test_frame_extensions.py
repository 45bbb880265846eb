"""Frame extensions on the wire: `tool_calls` (codec-spec.md §2.5) and `msgpack-delta` (§1.5)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.wire import codec_pb2
from proxy.core.wire.decoder import FrameDecodeError, FrameDecoder
from proxy.core.wire.delta import decode_deltas, encode_deltas, unzigzag, zigzag
from proxy.core.wire.frames import (
    Frame,
    FrameEncoder,
    MsgpackDeltaFrameEncoder,
    MsgpackFrameEncoder,
    ProtobufFrameEncoder,
    encoder_for,
)
from proxy.core.wire.tool_calls import ToolCall
from tests.core.wire.test_frames import (
    chunkings,
    codecai_frames,
    frame_ids,
    token_ids,
)

MSGPACK: FrameEncoder = MsgpackFrameEncoder()
PROTOBUF: FrameEncoder = ProtobufFrameEncoder()
CALL = ToolCall("get_weather", '{"city": "Paris"}', "call_1")


def decode(stream_format: Any, chunks: list[bytes]) -> list[Frame]:
    decoder = FrameDecoder(stream_format)
    frames = [frame for chunk in chunks for frame in decoder.feed(chunk)]
    decoder.flush()
    return frames


def generated(frame: Frame) -> bytes:
    """protoc's bytes for the frame, tool calls included."""
    message = codec_pb2.CodecFrame(ids=frame.ids, done=frame.done)
    if frame.finish_reason is not None:
        message.finish_reason = frame.finish_reason
    for call in frame.tool_calls:
        entry = codec_pb2.ToolCall(arguments_json=call.arguments_json)
        if call.name is not None:
            entry.name = call.name
        if call.id is not None:
            entry.id = call.id
        message.tool_calls.append(entry)
    payload = message.SerializeToString()
    return len(payload).to_bytes(4, "big") + payload


# --- tool_calls -------------------------------------------------------------------------------


def test_tool_call_golden_bytes() -> None:
    frame = Frame((), True, "tool_call", (CALL,))
    # msgpack: ids, done, finish_reason, then tool_calls; the call's keys in the engines' order.
    assert list(msgpack.unpackb(MSGPACK.encode(frame))) == [
        "ids",
        "done",
        "finish_reason",
        "tool_calls",
    ]
    assert msgpack.unpackb(MSGPACK.encode(frame))["tool_calls"] == [
        {"name": "get_weather", "arguments_json": '{"city": "Paris"}', "id": "call_1"}
    ]
    # protobuf field 4 = 0x22, ToolCall{0a name, 12 arguments_json, 1a id} (interop.md §2.1).
    call = b"\x0a\x0bget_weather" + b'\x12\x11{"city": "Paris"}' + b"\x1a\x06call_1"
    payload = b"\x10\x01\x1a\x09tool_call" + b"\x22" + bytes([len(call)]) + call
    assert PROTOBUF.encode(frame) == len(payload).to_bytes(4, "big") + payload


def test_absent_name_and_id_stay_absent() -> None:
    frame = Frame((7,), tool_calls=(ToolCall(None, "{}"),))
    assert msgpack.unpackb(MSGPACK.encode(frame))["tool_calls"] == [{"arguments_json": "{}"}]
    assert PROTOBUF.encode(frame).endswith(b"\x22\x04\x12\x02{}")
    for encoder, fmt in [(MSGPACK, "msgpack"), (PROTOBUF, "protobuf")]:
        assert decode(fmt, [encoder.encode(frame)]) == [frame]


def test_frames_without_calls_have_no_tool_calls_key() -> None:
    assert "tool_calls" not in msgpack.unpackb(MSGPACK.encode(Frame((1,), True, "length")))


async def test_codecai_skips_tool_calls_and_keeps_ids() -> None:
    frames = [Frame((5, 6), tool_calls=(CALL,)), Frame((7,), True, "tool_call", (CALL, CALL))]
    for encoder, fmt in [(MSGPACK, "msgpack"), (PROTOBUF, "protobuf")]:
        body = b"".join(encoder.encode(frame) for frame in frames)
        decoded = await codecai_frames(fmt, [body])  # type: ignore[arg-type]
        assert decoded == [Frame((5, 6)), Frame((7,), True, "tool_call")]


texts = st.text(max_size=12)
tool_calls = st.builds(ToolCall, st.none() | texts, texts, st.none() | texts)
frames_with_calls = st.builds(
    Frame,
    frame_ids,
    st.booleans(),
    st.none() | st.sampled_from(["tool_call", "length"]),
    st.lists(tool_calls, max_size=3).map(tuple),
)


@given(frames_with_calls)
def test_protobuf_with_tool_calls_is_the_generated_encoding(frame: Frame) -> None:
    assert PROTOBUF.encode(frame) == generated(frame)


@given(st.lists(frames_with_calls, max_size=4), st.data())
@pytest.mark.parametrize("fmt", ["msgpack", "msgpack-delta", "protobuf"])
def test_tool_calls_round_trip_at_any_chunking(
    fmt: str, frames: list[Frame], data: st.DataObject
) -> None:
    frames = [Frame(f.ids, False, f.finish_reason, f.tool_calls) for f in frames]
    encoder = encoder_for(fmt)
    body = b"".join(encoder.encode(frame) for frame in frames)
    assert decode(fmt, data.draw(chunkings(body))) == frames


# --- msgpack-delta ----------------------------------------------------------------------------


def test_zigzag_table() -> None:
    # codec-spec.md §1.5 / stream_delta.py: n >= 0 -> 2n, n < 0 -> -2n-1.
    assert [zigzag(n) for n in (0, -1, 1, -2, 2, -64, 63)] == [0, 1, 2, 3, 4, 127, 126]
    assert [unzigzag(z) for z in range(6)] == [0, -1, 1, -2, 2, -3]


@given(st.integers(-(1 << 33), 1 << 33))
def test_zigzag_inverts(value: int) -> None:
    assert unzigzag(zigzag(value)) == value
    assert zigzag(value) >= 0


@given(st.lists(token_ids, max_size=30), token_ids)
def test_deltas_are_chained_from_the_base(ids: list[int], base: int) -> None:
    deltas = encode_deltas(ids, base)
    assert list(decode_deltas(deltas, base)) == ids
    previous = [base, *ids][: len(ids)]
    assert deltas == [zigzag(i - p) for i, p in zip(ids, previous, strict=True)]


def test_delta_golden_stream() -> None:
    encoder = MsgpackDeltaFrameEncoder()
    frames = [
        Frame((9707,)),
        Frame((9708, 9700)),
        Frame((), True, "length"),
    ]
    wire = [encoder.encode(frame) for frame in frames]
    assert [msgpack.unpackb(w) for w in wire] == [
        {"base_id": 0, "ids_delta": [19414], "done": False},
        {"base_id": 9707, "ids_delta": [2, 15], "done": False},
        {"base_id": 9700, "ids_delta": [], "done": True, "finish_reason": "length"},
    ]
    # Exact bytes of the second frame: fixmap(3), keys as str, deltas as fixints.
    assert wire[1] == bytes.fromhex(
        "83 a7 62617365 5f6964 cd 25 eb a9 6964735f64656c7461 92 02 0f a4 646f6e65 c2"
    )
    assert decode("msgpack-delta", [b"".join(wire)]) == frames


def test_delta_frames_decode_on_their_own() -> None:
    encoder = MsgpackDeltaFrameEncoder()
    wire = [encoder.encode(Frame(ids)) for ids in [(5, 9), (100,), (3, 3, 2)]]
    # Any frame alone gives its own IDs: the base travels with it.
    assert [decode("msgpack-delta", [w]) for w in wire] == [
        [Frame((5, 9))],
        [Frame((100,))],
        [Frame((3, 3, 2))],
    ]


def test_delta_base_survives_an_empty_frame() -> None:
    encoder = MsgpackDeltaFrameEncoder()
    encoder.encode(Frame((40,)))
    encoder.encode(Frame((), tool_calls=(CALL,)))
    assert msgpack.unpackb(encoder.encode(Frame((41,))))["base_id"] == 40


@given(st.lists(st.builds(Frame, frame_ids), max_size=6), st.data())
def test_delta_round_trip_at_any_chunking(frames: list[Frame], data: st.DataObject) -> None:
    encoder = MsgpackDeltaFrameEncoder()
    frames = [*frames, Frame((), True, "eos_token")]
    body = b"".join(encoder.encode(frame) for frame in frames)
    assert decode("msgpack-delta", data.draw(chunkings(body))) == frames


BAD_DELTA_FRAMES = {
    "plain frame": {"ids": [1], "done": False},
    "base missing": {"ids_delta": [1], "done": False},
    "base negative": {"base_id": -1, "ids_delta": [], "done": False},
    "base over uint32": {"base_id": 1 << 32, "ids_delta": [], "done": False},
    "delta negative": {"base_id": 0, "ids_delta": [-1], "done": False},
    "delta not an int": {"base_id": 0, "ids_delta": ["1"], "done": False},
    "delta below zero id": {"base_id": 0, "ids_delta": [1], "done": False},
    "delta over uint32": {"base_id": 0xFFFFFFFF, "ids_delta": [2], "done": False},
    "done missing": {"base_id": 0, "ids_delta": []},
}


@pytest.mark.parametrize("value", BAD_DELTA_FRAMES.values(), ids=BAD_DELTA_FRAMES.keys())
def test_invalid_delta_frames(value: dict[str, Any]) -> None:
    with pytest.raises(FrameDecodeError):
        decode("msgpack-delta", [msgpack.packb(value)])


def test_delta_bytes_per_token_against_plain_msgpack() -> None:
    # The point of delta frames is multi-ID frames of nearby IDs; single-ID frames pay for
    # the longer keys. Both directions are asserted so the trade-off stays visible.
    ids = list(range(1000, 1064))
    plain = MSGPACK.encode(Frame(tuple(ids)))
    delta = MsgpackDeltaFrameEncoder().encode(Frame(tuple(ids)))
    assert len(delta) < len(plain) / 2
    one_plain = [MSGPACK.encode(Frame((i,))) for i in ids]
    encoder = MsgpackDeltaFrameEncoder()
    one_delta = [encoder.encode(Frame((i,))) for i in ids]
    assert sum(map(len, one_delta)) > sum(map(len, one_plain))


def test_codecai_reads_nothing_it_does_not_know() -> None:
    # A plain-msgpack client handed a delta stream fails loudly (no `ids`), never silently
    # misreads it: why delta stays opt-in.
    body = MsgpackDeltaFrameEncoder().encode(Frame((1,), True, "length"))
    with pytest.raises(ValueError, match="invalid frame shape"):
        asyncio.run(codecai_frames("msgpack", [body]))
