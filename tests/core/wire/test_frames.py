"""Codec frames: golden bytes, the reference decoders, round trips, strict decoding, fuzz."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import FrozenInstanceError
from typing import Any, Literal

import codecai
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import BadRequest
from proxy.core.wire import codec_pb2, decoder
from proxy.core.wire.decoder import DEFAULT_MAX_FRAME_BYTES, FrameDecodeError, FrameDecoder
from proxy.core.wire.frames import (
    Frame,
    FrameEncoder,
    MsgpackDeltaFrameEncoder,
    MsgpackFrameEncoder,
    PrefixedMsgpackFrameEncoder,
    ProtobufFrameEncoder,
    _protobuf_payload_by_hand,
    encoder_for,
)
from proxy.core.wire.tool_calls import ToolCall

MSGPACK = MsgpackFrameEncoder()
PREFIXED_MSGPACK = PrefixedMsgpackFrameEncoder()
PROTOBUF = ProtobufFrameEncoder()
ENCODERS: list[FrameEncoder] = [MSGPACK, PREFIXED_MSGPACK, PROTOBUF]
StreamFormat = Literal["msgpack", "protobuf"]


def fmt(encoder: FrameEncoder) -> StreamFormat:
    return "protobuf" if encoder.stream_format == "protobuf" else "msgpack"


def decode(
    stream_format: StreamFormat, chunks: Iterable[bytes], max_frame_bytes: int = 1 << 24
) -> list[Frame]:
    decoder = FrameDecoder(stream_format, max_frame_bytes)
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    decoder.flush()
    return frames


# How a msgpack frame is unpacked: whole while small (the default), or a value at a time, as a
# large one is; every frame decodes the same either way.
UNPACKING = ["whole", "by-values"]


@contextlib.contextmanager
def unpacking(how: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        if how == "by-values":
            patch.setattr(decoder, "_UNPACKED_WHOLE_BYTES", 0)
        yield


def generated_protobuf(frame: Frame) -> bytes:
    """The reference bytes: protoc's generated class for proxy/codec.proto."""
    message = codec_pb2.CodecFrame(ids=frame.ids, done=frame.done)
    if frame.finish_reason is not None:
        message.finish_reason = frame.finish_reason
    return bytes(message.SerializeToString())


def prefixed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


async def as_body(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def codecai_frames(stream_format: StreamFormat, chunks: Iterable[bytes]) -> list[Frame]:
    decode_stream = (
        codecai.decode_protobuf_stream
        if stream_format == "protobuf"
        else codecai.decode_msgpack_stream
    )
    return [
        Frame(tuple(f.ids), f.done, f.finish_reason) async for f in decode_stream(as_body(chunks))
    ]


# --- Golden bytes ---------------------------------------------------------------------------

TERMINAL_LENGTH = Frame((), done=True, finish_reason="length")
GOLDEN_MSGPACK = [
    # codec-spec.md §1.1
    (Frame((9707,)), "82 a3 69 64 73 91 cd 25 eb a4 64 6f 6e 65 c2"),
    (Frame((1234, 5678)), "82 a3 69 64 73 92 cd 04 d2 cd 16 2e a4 64 6f 6e 65 c2"),
    (
        TERMINAL_LENGTH,
        "83 a3 69 64 73 90 a4 64 6f 6e 65 c3 ad 66 69 6e 69 73 68 5f 72 65 61 73 6f 6e "
        "a6 6c 65 6e 67 74 68",
    ),
    # interop.md §2.1: one-token frames of 13 B (id < 128) and 17 B (Qwen ids >= 65536)
    (Frame((5,)), "82 a3 69 64 73 91 05 a4 64 6f 6e 65 c2"),
    (Frame((151643,)), "82 a3 69 64 73 91 ce 00 02 50 5b a4 64 6f 6e 65 c2"),
    # smallest unsigned width in between: uint8
    (Frame((200,)), "82 a3 69 64 73 91 cc c8 a4 64 6f 6e 65 c2"),
]
GOLDEN_PROTOBUF = [
    # codec-spec.md §1.2
    (Frame((9707,)), "00 00 00 04 0a 02 eb 4b"),
    (Frame((1234, 5678)), "00 00 00 06 0a 04 d2 09 ae 2c"),
    (TERMINAL_LENGTH, "00 00 00 0a 10 01 1a 06 6c 65 6e 67 74 68"),
    # interop.md §2.1, sglang style
    (Frame((151643,)), "00 00 00 05 0a 03 db a0 09"),
]


@pytest.mark.parametrize(("frame", "wire"), GOLDEN_MSGPACK)
def test_msgpack_golden_bytes(frame: Frame, wire: str) -> None:
    assert MSGPACK.encode(frame) == bytes.fromhex(wire)
    assert decode("msgpack", [bytes.fromhex(wire)]) == [frame]


@pytest.mark.parametrize(("frame", "wire"), GOLDEN_MSGPACK)
def test_prefixed_msgpack_golden_bytes(frame: Frame, wire: str) -> None:
    body = bytes.fromhex(wire)
    assert PREFIXED_MSGPACK.encode(frame) == prefixed(body)
    assert decode("msgpack", [prefixed(body)]) == [frame]


@pytest.mark.parametrize(("frame", "wire"), GOLDEN_PROTOBUF)
def test_protobuf_golden_bytes(frame: Frame, wire: str) -> None:
    assert PROTOBUF.encode(frame) == bytes.fromhex(wire)
    assert decode("protobuf", [bytes.fromhex(wire)]) == [frame]


def test_msgpack_frame_sizes() -> None:
    # interop.md §2.1: 13 / 15 / 17 B one-token frames. It calls the terminal frame 34 B, but
    # its own bytes (the codec-spec.md §1.1 vector above) are 33 B, as msgpack itself packs them.
    sizes = [len(MSGPACK.encode(Frame((i,)))) for i in (5, 9707, 151643)]
    assert [*sizes, len(MSGPACK.encode(TERMINAL_LENGTH))] == [13, 15, 17, 33]


def test_msgpack_finish_reason_key_only_when_set() -> None:
    assert msgpack.unpackb(MSGPACK.encode(Frame((1,), done=True))) == {"ids": [1], "done": True}


def test_protobuf_empty_finish_reason_is_present() -> None:
    # `optional string` has explicit presence: "" is sent, and decodes back as "".
    frame = Frame((), done=True, finish_reason="")
    assert PROTOBUF.encode(frame) == bytes.fromhex("00 00 00 04 10 01 1a 00")
    assert decode("protobuf", [PROTOBUF.encode(frame)]) == [frame]


# --- Encoder surface ------------------------------------------------------------------------


def test_encoder_media_types() -> None:
    assert [(e.content_type, e.stream_format) for e in ENCODERS] == [
        ("application/x-msgpack", "msgpack"),
        ("application/codec+msgpack", "msgpack"),
        ("application/x-protobuf", "protobuf"),
    ]


def test_encoder_for() -> None:
    assert isinstance(encoder_for("msgpack"), MsgpackFrameEncoder)
    assert isinstance(encoder_for("msgpack", prefixed_msgpack=True), PrefixedMsgpackFrameEncoder)
    assert isinstance(encoder_for("protobuf"), ProtobufFrameEncoder)
    assert isinstance(encoder_for("protobuf", prefixed_msgpack=True), ProtobufFrameEncoder)
    # Delta encoders remember the last ID: a fresh one per response, never shared.
    delta = encoder_for("msgpack-delta", prefixed_msgpack=True)
    assert isinstance(delta, MsgpackDeltaFrameEncoder)
    assert delta is not encoder_for("msgpack-delta")
    assert (delta.content_type, delta.stream_format) == ("application/x-msgpack", "msgpack-delta")
    # protobuf-delta has no defined layout: answered as plain protobuf, which the encoder says.
    fallback = encoder_for("protobuf-delta")
    assert isinstance(fallback, ProtobufFrameEncoder)
    assert fallback.stream_format == "protobuf"


@pytest.mark.parametrize("stream_format", ["json", "msgpack-compact", "MSGPACK", ""])
def test_encoder_for_unknown_format_is_a_bad_request(stream_format: str) -> None:
    supported = "supported values: msgpack, msgpack-delta, protobuf, protobuf-delta"
    with pytest.raises(BadRequest, match=supported) as info:
        encoder_for(stream_format)
    assert info.value.status_hint == 400
    assert info.value.code == "invalid_stream_format"


def test_frame_is_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        Frame((1,)).done = True  # type: ignore[misc]


# --- Reference decoders ---------------------------------------------------------------------

GOLDEN_STREAM = [Frame((9707,)), Frame((1234, 5678)), Frame((151643, 5, 200)), TERMINAL_LENGTH]


@pytest.mark.parametrize("encoder", [MSGPACK, PROTOBUF], ids=["msgpack", "protobuf"])
async def test_codecai_decodes_our_stream(encoder: FrameEncoder) -> None:
    body = b"".join(encoder.encode(frame) for frame in GOLDEN_STREAM)
    assert await codecai_frames(fmt(encoder), [body]) == GOLDEN_STREAM
    assert await codecai_frames(fmt(encoder), byte_by_byte(body)) == GOLDEN_STREAM


async def test_codecai_rejects_prefixed_msgpack() -> None:
    # Why msgpack is unprefixed by default: the reference client reads the prefix's 0x00 as
    # a frame (the int 0) and gives up (interop.md §0.1).
    body = b"".join(PREFIXED_MSGPACK.encode(frame) for frame in GOLDEN_STREAM)
    with pytest.raises(ValueError, match="invalid frame shape"):
        await codecai_frames("msgpack", [body])


def test_msgpack_library_reads_concatenated_maps() -> None:
    unpacker = msgpack.Unpacker()
    unpacker.feed(b"".join(MSGPACK.encode(frame) for frame in GOLDEN_STREAM))
    maps = list(unpacker)
    assert [list(m) for m in maps] == [["ids", "done"]] * 3 + [["ids", "done", "finish_reason"]]
    assert [Frame(tuple(m["ids"]), m["done"], m.get("finish_reason")) for m in maps] == (
        GOLDEN_STREAM
    )


# --- Properties -----------------------------------------------------------------------------

# Every msgpack uint width and every varint length up to 5 bytes.
token_ids = st.one_of(
    st.integers(0, 0x7F),
    st.integers(0x80, 0xFF),
    st.integers(0x100, 0xFFFF),
    st.integers(0x10000, 0xFFFFFFFF),
)
finish_reasons = (
    st.none() | st.sampled_from(["length", "eos_token", "error"]) | st.text(max_size=20)
)
# Up to 40 ids: covers fixarray and array16, and both protobuf paths (<= 1 id by hand).
frame_ids = st.lists(token_ids, max_size=40).map(tuple)
any_frames = st.builds(Frame, frame_ids, st.booleans(), finish_reasons)


@st.composite
def frame_streams(draw: st.DrawFn) -> list[Frame]:
    """Frames as a server sends them: `done` only on the last one, which may be missing."""
    frames = draw(st.lists(st.builds(Frame, frame_ids, st.just(False), finish_reasons), max_size=6))
    if draw(st.booleans()):
        frames.append(Frame(draw(frame_ids), True, draw(finish_reasons)))
    return frames


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=10)))
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


@given(any_frames)
def test_protobuf_by_hand_is_byte_identical_to_generated_code(frame: Frame) -> None:
    assert _protobuf_payload_by_hand(frame) == generated_protobuf(frame)
    assert PROTOBUF.encode(frame) == prefixed(generated_protobuf(frame))


@given(any_frames)
def test_msgpack_is_the_reference_packing(frame: Frame) -> None:
    as_map: dict[str, Any] = {"ids": list(frame.ids), "done": frame.done}
    if frame.finish_reason is not None:
        as_map["finish_reason"] = frame.finish_reason
    assert MSGPACK.encode(frame) == msgpack.packb(as_map)
    assert PREFIXED_MSGPACK.encode(frame) == prefixed(msgpack.packb(as_map))


@pytest.mark.parametrize("how", UNPACKING)
@pytest.mark.parametrize("encoder", ENCODERS, ids=["msgpack", "prefixed-msgpack", "protobuf"])
@given(data=st.data(), frames=frame_streams())
def test_round_trip_at_any_chunking(
    encoder: FrameEncoder, how: str, data: st.DataObject, frames: list[Frame]
) -> None:
    body = b"".join(encoder.encode(frame) for frame in frames)
    with unpacking(how):
        assert decode(fmt(encoder), data.draw(chunkings(body))) == frames


@pytest.mark.parametrize("encoder", [MSGPACK, PROTOBUF], ids=["msgpack", "protobuf"])
@given(data=st.data(), frames=frame_streams())
def test_codecai_decodes_any_stream_at_any_chunking(
    encoder: FrameEncoder, data: st.DataObject, frames: list[Frame]
) -> None:
    body = b"".join(encoder.encode(frame) for frame in frames)
    decoded = asyncio.run(codecai_frames(fmt(encoder), data.draw(chunkings(body))))
    assert decoded == frames


@given(st.binary(max_size=200), st.data())
@pytest.mark.parametrize("stream_format", ["msgpack", "protobuf"])
def test_arbitrary_bytes_only_raise_frame_decode_errors(
    stream_format: StreamFormat, body: bytes, data: st.DataObject
) -> None:
    with contextlib.suppress(FrameDecodeError):
        decode(stream_format, data.draw(chunkings(body)), max_frame_bytes=64)


@given(frames=frame_streams(), data=st.data())
@pytest.mark.parametrize("how", UNPACKING)
@pytest.mark.parametrize("encoder", ENCODERS, ids=["msgpack", "prefixed-msgpack", "protobuf"])
def test_mutated_streams_only_raise_frame_decode_errors(
    encoder: FrameEncoder, how: str, frames: list[Frame], data: st.DataObject
) -> None:
    body = bytearray(b"".join(encoder.encode(frame) for frame in frames))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(body)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "insert" or position == len(body):
            body[position:position] = data.draw(st.binary(min_size=1, max_size=5))
        elif action == "flip":
            body[position] ^= data.draw(st.integers(1, 255))
        else:
            del body[position : position + data.draw(st.integers(1, 5))]
    with unpacking(how), contextlib.suppress(FrameDecodeError):
        for frame in decode(fmt(encoder), data.draw(chunkings(bytes(body)))):
            assert all(0 <= i <= 0xFFFFFFFF for i in frame.ids)


# --- Strict msgpack decoding ----------------------------------------------------------------


def packed_map(value: Any) -> bytes:
    return bytes(msgpack.packb(value))


@pytest.mark.parametrize("how", UNPACKING)
def test_msgpack_decoder_ignores_unknown_keys_and_key_order(how: str) -> None:
    tool_call = {"id": "call_1", "arguments_json": "{}", "name": "f", "index": 0}
    frame = {"done": True, "tool_calls": [tool_call], "x": 1, "ids": [7], "finish_reason": None}
    with unpacking(how):
        assert decode("msgpack", [packed_map(frame)]) == [
            Frame((7,), True, tool_calls=(ToolCall("f", "{}", "call_1"),))
        ]


def test_msgpack_frame_boundary_after_unknown_values_of_every_kind() -> None:
    # The boundary scan must size every msgpack type right, or the next frame is misread.
    unknown = [
        None, -1, -200, 1 << 40, 1.5, b"\x00" * 300, "s" * 40, "t" * 300, {"k": [1, {}]},
        msgpack.ExtType(1, b"x"), msgpack.ExtType(2, b"xy" * 8), msgpack.ExtType(5, b"abc"),
        msgpack.ExtType(6, b"z" * 300), list(range(20)),
    ]  # fmt: skip
    frame = packed_map({"ids": [1], "unknown": unknown, "done": False})
    terminal = MSGPACK.encode(TERMINAL_LENGTH)
    expected = [Frame((1,)), TERMINAL_LENGTH]
    assert decode("msgpack", byte_by_byte(frame + terminal)) == expected
    assert decode("msgpack", [frame + terminal]) == expected


def test_msgpack_decoder_accepts_map16_frames() -> None:
    frame = {"ids": [1], "done": False} | {f"x{i}": i for i in range(20)}
    body = packed_map(frame)
    assert body[0] == 0xDE
    assert decode("msgpack", byte_by_byte(body + MSGPACK.encode(TERMINAL_LENGTH))) == [
        Frame((1,)),
        TERMINAL_LENGTH,
    ]


BAD_MSGPACK_FRAMES = {
    "done missing": packed_map({"ids": [1]}),
    "done an int": packed_map({"ids": [1], "done": 1}),
    "ids missing": packed_map({"done": False}),
    "ids not an array": packed_map({"ids": 1, "done": False}),
    "negative id": packed_map({"ids": [-1], "done": False}),
    "id over uint32": packed_map({"ids": [1 << 32], "done": False}),
    "float id": packed_map({"ids": [1.0], "done": False}),
    "bool id": packed_map({"ids": [True], "done": False}),
    "finish_reason an int": packed_map({"ids": [], "done": True, "finish_reason": 1}),
    "tool_calls a map": packed_map({"ids": [], "done": True, "tool_calls": {}}),
    "tool call not a map": packed_map({"ids": [], "done": True, "tool_calls": ["f"]}),
    "tool call arguments missing": packed_map(
        {"ids": [], "done": True, "tool_calls": [{"name": "f", "arguments_json": None}]}
    ),
    "tool call name an int": packed_map(
        {"ids": [], "done": True, "tool_calls": [{"name": 1, "arguments_json": ""}]}
    ),
    "tool call id bytes": packed_map(
        {"ids": [], "done": True, "tool_calls": [{"arguments_json": "", "id": b"x"}]}
    ),
    "integer keys (msgpack-compact)": packed_map({0: [1], 1: False}),
    "invalid utf-8 key": bytes.fromhex("82 a3 69 64 ff 90 a4 64 6f 6e 65 c2"),
    "0xc1 inside": bytes.fromhex("82 a3 69 64 73 91 c1 a4 64 6f 6e 65 c2"),
    "starts with an array": packed_map([1, 2]),
    "starts with 0xc1": b"\xc1",
    "second frame not a map": MSGPACK.encode(Frame((1,))) + b"\x05",
    "prefixed payload of two maps": prefixed(MSGPACK.encode(Frame((1,))) * 2),
    "prefixed payload truncated": prefixed(MSGPACK.encode(Frame((1,)))[:-1]),
    "prefixed empty payload": prefixed(b""),
}


@pytest.mark.parametrize("how", UNPACKING)
@pytest.mark.parametrize("body", BAD_MSGPACK_FRAMES.values(), ids=BAD_MSGPACK_FRAMES.keys())
def test_invalid_msgpack_frames(body: bytes, how: str) -> None:
    with unpacking(how), pytest.raises(FrameDecodeError) as info:
        decode("msgpack", [body])
    assert info.value.status_hint == 400


def test_msgpack_frame_size_limit() -> None:
    body = MSGPACK.encode(Frame(tuple(range(40))))
    assert decode("msgpack", byte_by_byte(body), max_frame_bytes=len(body)) == [
        Frame(tuple(range(40)))
    ]
    with pytest.raises(FrameDecodeError, match="exceeds"):
        decode("msgpack", byte_by_byte(body), max_frame_bytes=len(body) - 1)


def test_msgpack_huge_declared_length_fails_without_waiting_for_it() -> None:
    # A str32 value claiming 4 GiB: refused from its header alone.
    decoder = FrameDecoder("msgpack")
    with pytest.raises(FrameDecodeError) as info:
        decoder.feed(bytes.fromhex("81 a3 69 64 73 db ff ff ff ff"))
    assert info.value.code == "frame_too_large"


def test_prefixed_msgpack_length_limit() -> None:
    with pytest.raises(FrameDecodeError, match="exceeds"):
        FrameDecoder("msgpack", max_frame_bytes=100).feed(struct.pack(">I", 101))


# --- Strict protobuf decoding ---------------------------------------------------------------


def test_protobuf_unpacked_ids_are_accepted() -> None:
    payload = bytes.fromhex("08 05 08 96 01 0a 01 07")  # 5, 150 unpacked, then 7 packed
    assert decode("protobuf", [prefixed(payload)]) == [Frame((5, 150, 7))]


def test_protobuf_explicit_done_false_is_accepted() -> None:
    # Older forks write `10 00` on every frame (codec-spec.md §1.2).
    assert decode("protobuf", [prefixed(bytes.fromhex("0a 01 05 10 00"))]) == [Frame((5,))]


def test_protobuf_unknown_fields_are_skipped() -> None:
    tool_call = bytes.fromhex("22 05 0a 01 66 12 00")  # field 4: ToolCall{name: "f"}
    tool_call += bytes.fromhex("22 04 30 01 12 00")  # ToolCall with an unknown field 6
    varint64 = bytes.fromhex("48 ff ff ff ff ff ff ff ff ff 01")  # field 9, 10-byte varint
    fixed64 = bytes.fromhex("51") + bytes(8)  # field 10
    fixed32 = bytes.fromhex("5d") + bytes(4)  # field 11
    unknown_bytes = bytes.fromhex("62 02 aa bb")  # field 12
    payload = bytes.fromhex("0a 01 05") + tool_call + varint64 + fixed64 + fixed32 + unknown_bytes
    assert decode("protobuf", [prefixed(payload + bytes.fromhex("10 01"))]) == [
        Frame((5,), done=True, tool_calls=(ToolCall("f", ""), ToolCall(None, "")))
    ]


def test_protobuf_largest_uint32_id() -> None:
    payload = bytes.fromhex("0a 05 ff ff ff ff 0f")
    assert decode("protobuf", [prefixed(payload)]) == [Frame((0xFFFFFFFF,))]


BAD_PROTOBUF_PAYLOADS = {
    "6-byte varint id": ("0a 06 ff ff ff ff ff 01", "varint_too_long"),
    "5-byte varint over uint32": ("0a 05 ff ff ff ff 1f", "bad_frame"),
    "truncated varint id": ("0a 02 ff ff", "truncated"),
    "truncated key": ("80", "truncated"),
    "6-byte key": ("ff ff ff ff ff 01", "varint_too_long"),
    "ids run past the frame": ("0a 05 01", "truncated"),
    "finish_reason not utf-8": ("1a 01 ff", "bad_frame"),
    "finish_reason as varint": ("18 01", "bad_frame"),
    "done as bytes": ("12 01 01", "bad_frame"),
    "ids as fixed32": ("0d 00 00 00 00", "bad_frame"),
    "tool_calls as varint": ("20 01", "bad_frame"),
    "tool call name as varint": ("22 02 08 01", "bad_frame"),
    "tool call arguments not utf-8": ("22 03 12 01 ff", "bad_frame"),
    "tool call runs past the frame": ("22 05 0a 01 66", "truncated"),
    "tool call field runs past the call": ("22 02 0a 05 66 66 66 66 66", "truncated"),
    "field number 0": ("02 00", "bad_frame"),
    "group wire type": ("23", "bad_frame"),
    "wire type 7": ("27", "bad_frame"),
    "unknown fixed64 truncated": ("51 00 00", "truncated"),
}


@pytest.mark.parametrize(
    ("payload", "code"), BAD_PROTOBUF_PAYLOADS.values(), ids=BAD_PROTOBUF_PAYLOADS.keys()
)
def test_invalid_protobuf_payloads(payload: str, code: str) -> None:
    with pytest.raises(FrameDecodeError) as info:
        decode("protobuf", [prefixed(bytes.fromhex(payload))])
    assert info.value.code == code


def test_protobuf_length_prefix_over_the_limit_fails_at_once() -> None:
    decoder = FrameDecoder("protobuf")
    with pytest.raises(FrameDecodeError, match="exceeds") as info:
        decoder.feed(struct.pack(">I", DEFAULT_MAX_FRAME_BYTES + 1))
    assert info.value.code == "frame_too_large"


# --- Stream boundaries ----------------------------------------------------------------------


@pytest.mark.parametrize("encoder", ENCODERS, ids=["msgpack", "prefixed-msgpack", "protobuf"])
def test_bytes_after_the_terminal_frame_are_an_error(encoder: FrameEncoder) -> None:
    terminal = encoder.encode(TERMINAL_LENGTH)
    with pytest.raises(FrameDecodeError) as info:
        decode(fmt(encoder), [terminal + encoder.encode(Frame((1,)))])
    assert info.value.code == "trailing_bytes"
    decoder = FrameDecoder(fmt(encoder))
    assert decoder.feed(terminal) == [TERMINAL_LENGTH]
    assert decoder.finished
    assert decoder.feed(b"") == []
    with pytest.raises(FrameDecodeError, match="after the terminal frame"):
        decoder.feed(b"\x00")


@pytest.mark.parametrize("encoder", ENCODERS, ids=["msgpack", "prefixed-msgpack", "protobuf"])
def test_flush_inside_a_frame_is_an_error(encoder: FrameEncoder) -> None:
    body = encoder.encode(Frame((1, 2, 3)))
    for cut in range(1, len(body)):
        decoder = FrameDecoder(fmt(encoder))
        assert decoder.feed(body[:cut]) == []
        with pytest.raises(FrameDecodeError, match="mid-frame") as info:
            decoder.flush()
        assert info.value.code == "truncated"


@pytest.mark.parametrize("stream_format", ["msgpack", "protobuf"])
def test_empty_stream_flushes_cleanly(stream_format: StreamFormat) -> None:
    decoder = FrameDecoder(stream_format)
    decoder.flush()
    assert not decoder.finished


def test_stream_without_terminal_frame_is_not_finished() -> None:
    decoder = FrameDecoder("protobuf")
    assert decoder.feed(PROTOBUF.encode(Frame((1,)))) == [Frame((1,))]
    decoder.flush()
    assert not decoder.finished


def test_decoder_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="stream_format"):
        FrameDecoder("json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        FrameDecoder("msgpack", max_frame_bytes=0)
