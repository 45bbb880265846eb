"""Codec frames on the wire: encoders for the response body and an incremental decoder.

Wire formats (codec-spec.md §1, interop.md §0 and §2.1):

- `msgpack`: concatenated MessagePack maps `{"ids": [uint], "done": bool, "finish_reason"?: str}`
  with no length prefix and no delimiter. Every spec version, engine and reference client agrees;
  `codecai` rejects a prefixed stream ("invalid frame shape").
- `protobuf`: per frame, a 4-byte big-endian length, then that many bytes of `CodecFrame`
  (proxy/codec.proto) with `ids` packed.
- `msgpack-delta` (spec v0.5, opt-in; codec-spec.md §1.5): the same concatenated maps, but
  `{"base_id", "ids_delta", "done", "finish_reason"?}` with zigzag deltas chained from the last
  id of the previous frame (proxy/core/delta.py). `protobuf-delta` is underspecified upstream
  (no field number for `ids_delta`, two for `base_id`, §11 item 8): it is answered as plain
  `protobuf`.
- The Codec website's framing, `uint32be(len) || msgpack map` as `application/codec+msgpack`,
  is not in any spec (codec-spec.md §11 items 1-2); it is produced only for clients that
  name that media type.
- Frames may carry `tool_calls` (codec-spec.md §2.5; proxy/core/tool_calls.py): msgpack key
  `tool_calls` after `finish_reason`, protobuf field 4, only when the frame has calls.

Frame `ids` are uint32 token IDs by contract (the upstream chunk parser and the tokenizer
guarantee it); encoders sit on the per-token hot path and do not re-check them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import msgpack

from proxy.core import codec_pb2, delta, protowire
from proxy.core.errors import BadRequest
from proxy.core.tool_calls import (
    ToolCall,
    tool_call_from_map,
    tool_call_from_protobuf,
    tool_call_map,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "SUPPORTED_FORMATS",
    "Frame",
    "FrameDecodeError",
    "FrameDecoder",
    "FrameEncoder",
    "MsgpackDeltaFrameEncoder",
    "MsgpackFrameEncoder",
    "PrefixedMsgpackFrameEncoder",
    "ProtobufFrameEncoder",
    "encoder_for",
]

# The frame cap suggested for inbound protobuf length prefixes (codec-spec.md §12 item 36).
# A real frame holds a few token IDs; this bounds what a peer can make us buffer.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

_MAX_UINT32 = protowire.MAX_UINT32
_LENGTH_PREFIX = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Frame:
    """One Codec frame. `ids` may be empty only on the terminal frame (codec-spec.md §2).

    `tool_calls` holds the calls completed since the previous frame (codec-spec.md §2.5).
    """

    ids: tuple[int, ...]
    done: bool = False
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


class FrameDecodeError(BadRequest):
    """Bytes that are not a valid Codec frame stream (400: the peer sent them)."""


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

    content_type: Final = "application/x-msgpack"
    stream_format: Final = "msgpack"

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

    content_type: Final = "application/x-msgpack"
    stream_format: Final = "msgpack-delta"

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

    content_type: Final = "application/codec+msgpack"
    stream_format: Final = "msgpack"

    def __init__(self) -> None:
        self._msgpack = MsgpackFrameEncoder()

    def encode(self, frame: Frame) -> bytes:
        body = self._msgpack.encode(frame)
        return _LENGTH_PREFIX.pack(len(body)) + body


class ProtobufFrameEncoder:
    """`uint32be(len) || CodecFrame` (codec-spec.md §1.2), canonical proto3 bytes.

    Frames with at most one ID (one per generated token, and the terminal frame) are encoded
    by hand, about twice as fast as building a `codec_pb2.CodecFrame`; the generated class
    wins from a few IDs on (crossover measured at 3-5 IDs, 10x at 64). tests/core/test_frames.py
    proves both paths byte-identical to `codec_pb2.CodecFrame(...).SerializeToString()`.
    """

    __slots__ = ()

    content_type: Final = "application/x-protobuf"
    stream_format: Final = "protobuf"

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
    "msgpack": _MSGPACK_ENCODER,
    "protobuf": ProtobufFrameEncoder(),
}
_PREFIXED_MSGPACK_ENCODER: Final = PrefixedMsgpackFrameEncoder()


# codec-spec.md §1.5: `protobuf-delta` has no defined wire layout; the spec lets a server
# answer a delta request with the standard variant, which we say in `Codec-Stream-Format`.
_DELTA_FALLBACKS: Final = {"protobuf-delta": "protobuf"}
SUPPORTED_FORMATS: Final = ("msgpack", "msgpack-delta", "protobuf", "protobuf-delta")


def encoder_for(stream_format: str, *, prefixed_msgpack: bool = False) -> FrameEncoder:
    """The encoder for a request's `stream_format`; a new one per response for delta formats.

    `prefixed_msgpack` selects the website framing for plain msgpack; it does not apply to
    protobuf, which is always prefixed, nor to msgpack-delta, which the website never framed.
    The encoder's `stream_format` is what is actually sent (`protobuf` for `protobuf-delta`).
    An unknown format is the client's error (codec-spec.md §12 item 11: 400 listing the
    supported values).
    """
    if prefixed_msgpack and stream_format == "msgpack":
        return _PREFIXED_MSGPACK_ENCODER
    if stream_format == "msgpack-delta":
        return MsgpackDeltaFrameEncoder()
    encoder = _ENCODERS.get(_DELTA_FALLBACKS.get(stream_format, stream_format))
    if encoder is None:
        supported = ", ".join(SUPPORTED_FORMATS)
        raise BadRequest(
            f"unsupported stream_format {stream_format!r}; supported: {supported}",
            code="unsupported_stream_format",
        )
    return encoder


# --- Decoder ------------------------------------------------------------------------------


class FrameDecoder:
    """Incremental decoder for a Codec response body: feed bytes, get the completed frames.

    msgpack streams are auto-detected from their first byte: 0x00 starts a 4-byte length prefix
    (website framing; a map header is never 0x00), a map header starts concatenated maps.
    The decoder is strict where the spec is: `done` is required and boolean, ids are uint32,
    protobuf varints for uint32 fields are at most 5 bytes, and nothing may follow the terminal
    frame (I-D: bytes after it are a protocol error). `tool_calls` are decoded; other unknown
    msgpack keys and protobuf fields are skipped.
    """

    __slots__ = (
        "_buffer",
        "_decode_payload",
        "_finished",
        "_framing",
        "_max_frame_bytes",
        "_read_pos",
        "_scan_pos",
        "_scan_values_left",
    )

    def __init__(
        self,
        stream_format: Literal["msgpack", "msgpack-delta", "protobuf"],
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if stream_format in ("msgpack", "msgpack-delta"):
            self._framing: _Framing | None = None  # decided by the first byte
            self._decode_payload: Callable[[bytes], Frame] = (
                _decode_msgpack_payload
                if stream_format == "msgpack"
                else _decode_msgpack_delta_payload
            )
        elif stream_format == "protobuf":
            self._framing = "length-prefixed"
            self._decode_payload = _decode_protobuf_payload
        else:
            raise ValueError(f"unknown stream_format {stream_format!r}")
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._read_pos = 0  # start of the next undecoded frame in _buffer
        # Resumable scan of a concatenated msgpack frame: where it stopped, and how many msgpack
        # values are still to be skipped before the frame's top-level map is complete.
        self._scan_pos = 0
        self._scan_values_left = 0
        self._finished = False

    @property
    def finished(self) -> bool:
        """Whether the terminal (`done`) frame has been decoded."""
        return self._finished

    def feed(self, data: bytes) -> list[Frame]:
        """Consume the next body bytes; return the frames they complete, in order."""
        if not data:
            return []
        if self._finished:
            raise _error("bytes after the terminal frame", "trailing_bytes")
        self._buffer += data
        if self._framing is None:
            self._framing = _detect_msgpack_framing(self._buffer[0])
        next_frame = (
            self._next_prefixed_payload
            if self._framing == "length-prefixed"
            else self._next_concatenated_payload
        )
        frames: list[Frame] = []
        while (payload := next_frame()) is not None:
            frame = self._decode_payload(payload)
            frames.append(frame)
            if frame.done:
                self._finished = True
                if self._read_pos < len(self._buffer):
                    raise _error("bytes after the terminal frame", "trailing_bytes")
                break
        if self._read_pos:
            del self._buffer[: self._read_pos]
            self._scan_pos -= self._read_pos
            self._read_pos = 0
        return frames

    def flush(self) -> None:
        """Signal end of body; raises `FrameDecodeError` if it stopped inside a frame."""
        if self._buffer:
            raise _error(f"stream ended mid-frame ({len(self._buffer)} bytes left)", "truncated")

    def _next_prefixed_payload(self) -> bytes | None:
        start = self._read_pos
        buffer = self._buffer
        if len(buffer) - start < _LENGTH_PREFIX.size:
            return None
        (length,) = _LENGTH_PREFIX.unpack_from(buffer, start)
        if length > self._max_frame_bytes:
            raise _frame_too_large(length, self._max_frame_bytes)
        end = start + _LENGTH_PREFIX.size + length
        if len(buffer) < end:
            return None
        self._read_pos = end
        return bytes(buffer[start + _LENGTH_PREFIX.size : end])

    def _next_concatenated_payload(self) -> bytes | None:
        buffer = self._buffer
        start = self._read_pos
        if self._scan_values_left == 0:
            # A new frame: it must be a map (codec-spec.md §1.1).
            if start >= len(buffer):
                return None
            if _MSGPACK_HEADERS[buffer[start]][0] != _MAP:
                raise _error(f"msgpack frame starts with 0x{buffer[start]:02x}, not a map")
            self._scan_pos = start
            self._scan_values_left = 1
        self._scan_pos, self._scan_values_left = _scan_msgpack(
            buffer, start, self._scan_pos, self._scan_values_left, self._max_frame_bytes
        )
        if self._scan_values_left:
            return None
        self._read_pos = self._scan_pos
        return bytes(buffer[start : self._scan_pos])


_Framing = Literal["length-prefixed", "concatenated"]


def _detect_msgpack_framing(first_byte: int) -> _Framing:
    if first_byte == 0x00:
        return "length-prefixed"
    if _MSGPACK_HEADERS[first_byte][0] == _MAP:
        return "concatenated"
    raise _error(f"msgpack stream starts with 0x{first_byte:02x}: neither a map nor a prefix")


def _error(message: str, code: str = "bad_frame") -> FrameDecodeError:
    return FrameDecodeError(f"Codec frame stream: {message}", code=code)


def _frame_too_large(size: int, limit: int) -> FrameDecodeError:
    return _error(f"frame of {size} bytes exceeds the {limit}-byte limit", "frame_too_large")


# --- msgpack ------------------------------------------------------------------------------

# How each msgpack first byte (msgpack spec "Formats") determines the value's extent:
#   _FIXED: the value is `param` bytes long in total;
#   _ARRAY / _MAP: `param` is the element count (fixarray/fixmap, header 1 byte) or, when
#     negative, minus the width of the big-endian count that follows the type byte;
#   _LENGTH_PREFIXED: bin/str, `param` is the width of the byte length after the type byte;
#   _EXT: like _LENGTH_PREFIXED plus one type byte before the data;
#   _NEVER_USED: 0xc1.
_FIXED, _ARRAY, _MAP, _LENGTH_PREFIXED, _EXT, _NEVER_USED = range(6)


def _msgpack_header_table() -> tuple[tuple[int, int], ...]:
    table: list[tuple[int, int]] = []
    fixed_width = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}
    fixed_width |= {0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10}
    fixed_width |= {0xD8: 18, 0xC0: 1, 0xC2: 1, 0xC3: 1}
    counted = {0xDC: (_ARRAY, -2), 0xDD: (_ARRAY, -4), 0xDE: (_MAP, -2), 0xDF: (_MAP, -4)}
    length_prefixed = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
    ext = {0xC7: 1, 0xC8: 2, 0xC9: 4}
    for byte in range(256):
        if byte <= 0x7F or byte >= 0xE0:
            table.append((_FIXED, 1))
        elif byte <= 0x8F:
            table.append((_MAP, byte & 0x0F))
        elif byte <= 0x9F:
            table.append((_ARRAY, byte & 0x0F))
        elif byte <= 0xBF:
            table.append((_FIXED, 1 + (byte & 0x1F)))
        elif byte in fixed_width:
            table.append((_FIXED, fixed_width[byte]))
        elif byte in counted:
            table.append(counted[byte])
        elif byte in length_prefixed:
            table.append((_LENGTH_PREFIXED, length_prefixed[byte]))
        elif byte in ext:
            table.append((_EXT, ext[byte]))
        else:
            table.append((_NEVER_USED, 0))
    return tuple(table)


_MSGPACK_HEADERS: Final = _msgpack_header_table()


def _scan_msgpack(
    buffer: bytearray, frame_start: int, pos: int, values_left: int, max_frame_bytes: int
) -> tuple[int, int]:
    """Skip `values_left` msgpack values from `pos` without building them.

    Returns where the scan stopped and how many values are still to be skipped: `(end, 0)`
    once the frame is complete, else the point to resume from when more bytes arrive.
    Iterative, so nesting depth costs nothing; every value is at least one byte, so the frame
    size limit bounds the work.
    """
    size = len(buffer)
    limit = frame_start + max_frame_bytes
    while values_left:
        if pos >= size:
            break
        kind, param = _MSGPACK_HEADERS[buffer[pos]]
        children = 0
        if kind == _FIXED:
            end = pos + param
        elif kind in (_MAP, _ARRAY):
            if param >= 0:
                children, end = param, pos + 1
            else:
                end = pos + 1 - param
                if end > size:
                    break
                children = int.from_bytes(buffer[pos + 1 : end], "big")
            if kind == _MAP:
                children *= 2
        elif kind in (_LENGTH_PREFIXED, _EXT):
            data_start = pos + 1 + param
            if data_start > size:
                break
            end = data_start + int.from_bytes(buffer[pos + 1 : data_start], "big")
            if kind == _EXT:
                end += 1  # the ext type byte
        else:
            raise _error(f"invalid msgpack byte 0xc1 at frame offset {pos - frame_start}")
        if end > limit:
            raise _frame_too_large(end - frame_start, max_frame_bytes)
        if end > size:
            break
        pos = end
        values_left += children - 1
    return pos, values_left


def _unpack_map(payload: bytes) -> Any:
    try:
        # strict_map_key: only str/bytes keys, never an unhashable container.
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except ValueError as exc:  # also UnicodeDecodeError and msgpack's ExtraData/FormatError
        raise _error(f"invalid msgpack frame: {str(exc) or type(exc).__name__}") from exc
    if type(value) is not dict:
        raise _error(f"msgpack frame is a {type(value).__name__}, not a map")
    return value


def _decode_msgpack_payload(payload: bytes) -> Frame:
    # codec-spec.md §1.1 and interop.md §0.3: `ids` and `done` required, `done` a real bool,
    # `finish_reason` str or nil, unknown keys ignored.
    value = _unpack_map(payload)
    ids = value.get("ids")
    if type(ids) is not list:
        raise _error("msgpack frame has no `ids` array")
    return _frame_from_map(value, _checked_ids(ids, "id"))


def _decode_msgpack_delta_payload(payload: bytes) -> Frame:
    # codec-spec.md §1.5: `{base_id, ids_delta, done, finish_reason?}`; each frame carries its
    # own base, so a frame decodes without the ones before it.
    value = _unpack_map(payload)
    base_id = value.get("base_id")
    deltas = value.get("ids_delta")
    if type(base_id) is not int or not 0 <= base_id <= _MAX_UINT32:
        raise _error("msgpack-delta frame has no uint32 `base_id`")
    if type(deltas) is not list:
        raise _error("msgpack-delta frame has no `ids_delta` array")
    ids = delta.decode_deltas(_checked_ids(deltas, "delta", limit=2 * _MAX_UINT32 + 1), base_id)
    return _frame_from_map(value, _checked_ids(ids, "id"))


def _checked_ids(values: list[Any], what: str, limit: int = _MAX_UINT32) -> list[int]:
    for value in values:
        if type(value) is not int or not 0 <= value <= limit:
            raise _error(f"msgpack frame {what} {value!r} is out of range")
    return values


def _frame_from_map(value: dict[str, Any], ids: list[int]) -> Frame:
    done = value.get("done")
    if type(done) is not bool:
        raise _error("msgpack frame `done` is missing or not a bool")
    finish_reason = value.get("finish_reason")
    if finish_reason is not None and type(finish_reason) is not str:
        raise _error("msgpack frame `finish_reason` is neither a str nor nil")
    calls = value.get("tool_calls")
    if calls is None:
        return Frame(tuple(ids), done, finish_reason)
    if type(calls) is not list:
        raise _error("msgpack frame `tool_calls` is not an array")
    return Frame(
        tuple(ids), done, finish_reason, tuple(tool_call_from_map(c, _error) for c in calls)
    )


# --- protobuf -----------------------------------------------------------------------------


def _decode_protobuf_payload(payload: bytes) -> Frame:
    reader = protowire.WireReader(payload, _error, "bad_frame")
    ids: list[int] = []
    done = False
    finish_reason: str | None = None
    calls: list[ToolCall] = []
    while not reader.at_end:
        field, wire_type = reader.key()
        if field == 1 and wire_type == protowire.LEN:  # ids, packed (codec-spec.md §1.2)
            packed_end = reader.length_delimited_end()
            while reader.pos < packed_end:
                ids.append(reader.uint32(packed_end))
        elif field == 1 and wire_type == protowire.VARINT:
            # Unpacked ids: valid proto3 input that the reference decoders silently drop.
            ids.append(reader.uint32())
        elif field == 2 and wire_type == protowire.VARINT:
            done = reader.varint(protowire.UINT64_VARINT_BYTES) != 0
        elif field == 3 and wire_type == protowire.LEN:
            finish_reason = reader.text("finish_reason")
        elif field == 4 and wire_type == protowire.LEN:  # tool_calls (codec-spec.md §2.5)
            calls.append(
                tool_call_from_protobuf(reader.take(reader.length_delimited_end()), _error)
            )
        elif field <= 4:
            raise _error(f"protobuf field {field} has wire type {wire_type}")
        else:
            reader.skip(wire_type)
    return Frame(tuple(ids), done, finish_reason, tuple(calls))
