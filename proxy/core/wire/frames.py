"""Codec frames on the wire: the `Frame` and the encoders for the response body.

Wire formats (codec-spec.md §1, interop.md §0 and §2.1):

- `msgpack`: concatenated MessagePack maps `{"ids": [uint], "done": bool, "finish_reason"?: str}`
  with no length prefix and no delimiter. Every spec version, engine and reference client agrees;
  `codecai` rejects a prefixed stream ("invalid frame shape").
- `protobuf`: per frame, a 4-byte big-endian length, then that many bytes of `CodecFrame`
  (proxy/codec.proto) with `ids` packed.
- `msgpack-delta` (spec v0.5, opt-in; codec-spec.md §1.5): the same concatenated maps, but
  `{"base_id", "ids_delta", "done", "finish_reason"?}` with zigzag deltas chained from the last
  id of the previous frame (proxy/core/wire/delta.py). `protobuf-delta` is underspecified upstream
  (no field number for `ids_delta`, two for `base_id`, §11 item 8): it is answered as plain
  `protobuf`.
- The Codec website's framing, `uint32be(len) || msgpack map` as `application/codec+msgpack`,
  is not in any spec (codec-spec.md §11 items 1-2); it is produced only for clients that
  name that media type.
- Frames may carry `tool_calls` (codec-spec.md §2.5; proxy/core/wire/tool_calls.py): msgpack key
  `tool_calls` after `finish_reason`, protobuf field 4, only when the frame has calls.

Frame `ids` are uint32 token IDs by contract (the upstream chunk parser and the tokenizer
guarantee it); encoders sit on the per-token hot path and do not re-check them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import msgpack

from proxy.core.wire import codec_pb2, delta, protowire
from proxy.core.wire.formats import (
    MEDIA_TYPES,
    MSGPACK,
    MSGPACK_DELTA,
    PREFIXED_MSGPACK_MEDIA_TYPE,
    PROTOBUF,
    SENT_AS,
    check_stream_format,
)
from proxy.core.wire.tool_calls import ToolCall, tool_call_map

__all__ = [
    "Frame",
    "FrameEncoder",
    "MsgpackDeltaFrameEncoder",
    "MsgpackFrameEncoder",
    "PrefixedMsgpackFrameEncoder",
    "ProtobufFrameEncoder",
    "encoder_for",
]

_LENGTH_PREFIX = struct.Struct(">I")


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """One Codec frame. `ids` may be empty only on the terminal frame (codec-spec.md §2).

    `ids` is a tuple in the frames the proxy makes; a decoded frame holds them in an
    `array("I")`, 4 bytes an ID (decoder.py), and equals a made one with the same IDs.
    `tool_calls` holds the calls completed since the previous frame (codec-spec.md §2.5).
    """

    ids: Sequence[int]
    done: bool = False
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        ids, other_ids = self.ids, other.ids
        same_ids = (
            ids == other_ids if type(ids) is type(other_ids) else tuple(ids) == tuple(other_ids)
        )
        return same_ids and (self.done, self.finish_reason, self.tool_calls) == (
            other.done,
            other.finish_reason,
            other.tool_calls,
        )

    def __hash__(self) -> int:
        return hash((tuple(self.ids), self.done, self.finish_reason, self.tool_calls))


class FrameEncoder(Protocol):
    """Turns frames into response-body bytes for one wire format."""

    @property
    def content_type(self) -> str: ...

    @property
    def stream_format(self) -> str: ...

    def encode(self, frame: Frame) -> bytes: ...


# --- Encoders -----------------------------------------------------------------------------


class MsgpackFrameEncoder:
    """Concatenated MessagePack maps, no prefix: the spec's `msgpack` mode (codec-spec.md §1.1)."""

    __slots__ = ("_pack",)

    content_type: Final = MEDIA_TYPES[MSGPACK]
    stream_format: Final = MSGPACK

    def __init__(self) -> None:
        # msgpack packs non-negative ints with the smallest unsigned width, tuples as arrays,
        # bools as c2/c3 and keeps dict order: exactly what the engines send (interop.md §0.3).
        # A C Packer is ~5x faster than a Python loop at 64 IDs and on par at one.
        self._pack: Callable[[object], bytes] = msgpack.Packer().pack

    def encode(self, frame: Frame) -> bytes:
        # interop.md §0.3: key order ids, done, then finish_reason only when not null, then
        # tool_calls only when non-empty.
        if frame.tool_calls:
            return self._pack(_with_optional_keys({"ids": frame.ids, "done": frame.done}, frame))
        if frame.finish_reason is None:
            return self._pack({"ids": frame.ids, "done": frame.done})
        return self._pack(
            {"ids": frame.ids, "done": frame.done, "finish_reason": frame.finish_reason}
        )


def _with_optional_keys(value: dict[str, object], frame: Frame) -> dict[str, object]:
    if frame.finish_reason is not None:
        value["finish_reason"] = frame.finish_reason
    if frame.tool_calls:
        value["tool_calls"] = [tool_call_map(call) for call in frame.tool_calls]
    return value


class MsgpackDeltaFrameEncoder:
    """`msgpack-delta` (codec-spec.md §1.5): one instance per response, it remembers the last ID.

    Every frame carries its own `base_id` (the last ID of the previous frame, 0 at first), so
    each frame decodes on its own; the state is only needed to write them.
    """

    __slots__ = ("_base", "_pack")

    content_type: Final = MEDIA_TYPES[MSGPACK_DELTA]
    stream_format: Final = MSGPACK_DELTA

    def __init__(self) -> None:
        self._pack: Callable[[object], bytes] = msgpack.Packer().pack
        self._base = 0

    def encode(self, frame: Frame) -> bytes:
        # Key order as the reference `stream_delta.py` struct: base_id, ids_delta, done, then
        # finish_reason (only when set; the spec marks it optional) and tool_calls.
        value: dict[str, object] = {
            "base_id": self._base,
            "ids_delta": delta.encode_deltas(frame.ids, self._base),
            "done": frame.done,
        }
        if frame.ids:
            self._base = frame.ids[-1]
        return self._pack(_with_optional_keys(value, frame))


class PrefixedMsgpackFrameEncoder:
    """The Codec website's framing: 4-byte big-endian length, then the msgpack map.

    Only for clients whose Accept names `application/codec+msgpack`; spec clients such as
    `codecai` reject it, reading the prefix's first byte as a frame.
    """

    __slots__ = ("_msgpack",)

    content_type: Final = PREFIXED_MSGPACK_MEDIA_TYPE
    stream_format: Final = MSGPACK

    def __init__(self) -> None:
        self._msgpack = MsgpackFrameEncoder()

    def encode(self, frame: Frame) -> bytes:
        body = self._msgpack.encode(frame)
        return _LENGTH_PREFIX.pack(len(body)) + body


class ProtobufFrameEncoder:
    """`uint32be(len) || CodecFrame` (codec-spec.md §1.2), canonical proto3 bytes.

    Frames with at most one ID (one per generated token, and the terminal frame) are encoded
    by hand, about twice as fast as building a `codec_pb2.CodecFrame`; the generated class
    wins from a few IDs on (crossover measured at 3-5 IDs, 10x at 64).
    tests/core/wire/test_frames.py proves both paths byte-identical to
    `codec_pb2.CodecFrame(...).SerializeToString()`.
    """

    __slots__ = ()

    content_type: Final = MEDIA_TYPES[PROTOBUF]
    stream_format: Final = PROTOBUF

    def encode(self, frame: Frame) -> bytes:
        if len(frame.ids) > 1 or frame.tool_calls:
            payload = _protobuf_payload_generated(frame)
        else:
            payload = _protobuf_payload_by_hand(frame)
        return _LENGTH_PREFIX.pack(len(payload)) + payload


def _protobuf_payload_generated(frame: Frame) -> bytes:
    message = codec_pb2.CodecFrame(ids=frame.ids, done=frame.done)
    if frame.finish_reason is not None:
        message.finish_reason = frame.finish_reason
    for call in frame.tool_calls:
        # `name` and `id` are `optional`: set only when present, so absent stays absent.
        entry = message.tool_calls.add(arguments_json=call.arguments_json)
        if call.name is not None:
            entry.name = call.name
        if call.id is not None:
            entry.id = call.id
    payload: bytes = message.SerializeToString()
    return payload


# Field keys, (field_number << 3) | wire_type.
_IDS_KEY: Final = b"\x0a"  # 1, length-delimited
_DONE_TRUE: Final = b"\x10\x01"  # 2, varint
_FINISH_REASON_KEY: Final = b"\x1a"  # 3, length-delimited
_TOOL_CALL_KEY: Final = 0x22  # 4, length-delimited
_varint = protowire.varint


def _protobuf_payload_by_hand(frame: Frame) -> bytes:
    # codec-spec.md §1.2: ids MUST be packed (reference decoders drop unpacked ids), and are
    # omitted when empty; `done` is omitted when false (proto3 default), as sglang does.
    payload = b""
    if frame.ids:
        packed = b"".join(map(_varint, frame.ids))
        payload = _IDS_KEY + _varint(len(packed)) + packed
    if frame.done:
        payload += _DONE_TRUE
    if frame.finish_reason is not None:
        # `optional` gives explicit presence: even "" is written, as the generated code does.
        text = frame.finish_reason.encode()
        payload += _FINISH_REASON_KEY + _varint(len(text)) + text
    return payload


_MSGPACK_ENCODER: Final = MsgpackFrameEncoder()
_ENCODERS: Final[dict[str, FrameEncoder]] = {
    MSGPACK: _MSGPACK_ENCODER,
    PROTOBUF: ProtobufFrameEncoder(),
}
_PREFIXED_MSGPACK_ENCODER: Final = PrefixedMsgpackFrameEncoder()


def encoder_for(stream_format: str, *, prefixed_msgpack: bool = False) -> FrameEncoder:
    """The encoder for a request's `stream_format`; a new one per response for delta formats.

    `prefixed_msgpack` selects the website framing for plain msgpack; it does not apply to
    protobuf, which is always prefixed, nor to msgpack-delta, which the website never framed.
    The encoder's `stream_format` is what is actually sent (`protobuf` for `protobuf-delta`).
    An unknown format is the client's error (codec-spec.md §12 item 11: 400 listing the
    supported values).
    """
    sent = SENT_AS.get(check_stream_format(stream_format, json_allowed=False), stream_format)
    if prefixed_msgpack and sent == MSGPACK:
        return _PREFIXED_MSGPACK_ENCODER
    if sent == MSGPACK_DELTA:
        return MsgpackDeltaFrameEncoder()
    return _ENCODERS[sent]
