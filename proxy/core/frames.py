"""Codec frames on the wire: encoders for the response body and an incremental decoder.

Wire formats (codec-spec.md §1, interop.md §0 and §2.1):

- `msgpack`: concatenated MessagePack maps `{"ids": [uint], "done": bool, "finish_reason"?: str}`
  with no length prefix and no delimiter. Every spec version, engine and reference client agrees;
  `codecai` rejects a prefixed stream ("invalid frame shape").
- `protobuf`: per frame, a 4-byte big-endian length, then that many bytes of `CodecFrame`
  (proxy/codec.proto) with `ids` packed.
- The Codec website's framing, `uint32be(len) || msgpack map` as `application/codec+msgpack`,
  is not in any spec (codec-spec.md §11 items 1-2); it is produced only for clients that
  name that media type.

Frame `ids` are uint32 token IDs by contract (the upstream chunk parser and the tokenizer
guarantee it); encoders sit on the per-token hot path and do not re-check them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import msgpack

from proxy.core import codec_pb2
from proxy.core.errors import BadRequest

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "Frame",
    "FrameDecodeError",
    "FrameDecoder",
    "FrameEncoder",
    "MsgpackFrameEncoder",
    "PrefixedMsgpackFrameEncoder",
    "ProtobufFrameEncoder",
    "encoder_for",
]

# The frame cap suggested for inbound protobuf length prefixes (codec-spec.md §12 item 36).
# A real frame holds a few token IDs; this bounds what a peer can make us buffer.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

_MAX_UINT32 = 0xFFFFFFFF
_LENGTH_PREFIX = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Frame:
    """One Codec frame. `ids` may be empty only on the terminal frame (codec-spec.md §2)."""

    ids: tuple[int, ...]
    done: bool = False
    finish_reason: str | None = None


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
        # interop.md §0.3: key order ids, done, then finish_reason only when not null.
        if frame.finish_reason is None:
            return self._pack({"ids": frame.ids, "done": frame.done})
        return self._pack(
            {"ids": frame.ids, "done": frame.done, "finish_reason": frame.finish_reason}
        )


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
        if len(frame.ids) > 1:
            payload = _protobuf_payload_generated(frame)
        else:
            payload = _protobuf_payload_by_hand(frame)
        return _LENGTH_PREFIX.pack(len(payload)) + payload


def _protobuf_payload_generated(frame: Frame) -> bytes:
    message = codec_pb2.CodecFrame(ids=frame.ids, done=frame.done)
    if frame.finish_reason is not None:
        message.finish_reason = frame.finish_reason
    payload: bytes = message.SerializeToString()
    return payload


# Field keys, (field_number << 3) | wire_type.
_IDS_KEY: Final = b"\x0a"  # 1, length-delimited
_DONE_TRUE: Final = b"\x10\x01"  # 2, varint
_FINISH_REASON_KEY: Final = b"\x1a"  # 3, length-delimited
_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))


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


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_MSGPACK_ENCODER: Final = MsgpackFrameEncoder()
_ENCODERS: Final[dict[str, FrameEncoder]] = {
    "msgpack": _MSGPACK_ENCODER,
    "protobuf": ProtobufFrameEncoder(),
}
_PREFIXED_MSGPACK_ENCODER: Final = PrefixedMsgpackFrameEncoder()


def encoder_for(stream_format: str, *, prefixed_msgpack: bool = False) -> FrameEncoder:
    """The encoder for a request's `stream_format` ("msgpack" or "protobuf").

    `prefixed_msgpack` selects the website framing for msgpack; it does not apply to protobuf,
    which is always prefixed. An unknown format is the client's error (codec-spec.md §12 item
    11: 400 listing the supported values).
    """
    if prefixed_msgpack and stream_format == "msgpack":
        return _PREFIXED_MSGPACK_ENCODER
    encoder = _ENCODERS.get(stream_format)
    if encoder is None:
        supported = ", ".join(sorted(_ENCODERS))
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
    frame (I-D: bytes after it are a protocol error). Unknown msgpack keys and unknown protobuf
    fields (e.g. `tool_calls`) are skipped.
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
        stream_format: Literal["msgpack", "protobuf"],
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if stream_format == "msgpack":
            self._framing: _Framing | None = None  # decided by the first byte
            self._decode_payload: Callable[[bytes], Frame] = _decode_msgpack_payload
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


def _decode_msgpack_payload(payload: bytes) -> Frame:
    try:
        # strict_map_key: only str/bytes keys, never an unhashable container.
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except ValueError as exc:  # also UnicodeDecodeError and msgpack's ExtraData/FormatError
        raise _error(f"invalid msgpack frame: {str(exc) or type(exc).__name__}") from exc
    return _frame_from_map(value)


def _frame_from_map(value: Any) -> Frame:
    # codec-spec.md §1.1 and interop.md §0.3: `ids` and `done` required, `done` a real bool,
    # `finish_reason` str or nil, unknown keys ignored.
    if type(value) is not dict:
        raise _error(f"msgpack frame is a {type(value).__name__}, not a map")
    ids = value.get("ids")
    if type(ids) is not list:
        raise _error("msgpack frame has no `ids` array")
    for token_id in ids:
        if type(token_id) is not int or not 0 <= token_id <= _MAX_UINT32:
            raise _error(f"msgpack frame id {token_id!r} is not a uint32")
    done = value.get("done")
    if type(done) is not bool:
        raise _error("msgpack frame `done` is missing or not a bool")
    finish_reason = value.get("finish_reason")
    if finish_reason is not None and type(finish_reason) is not str:
        raise _error("msgpack frame `finish_reason` is neither a str nor nil")
    return Frame(tuple(ids), done, finish_reason)


# --- protobuf -----------------------------------------------------------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# I-D § Security: a uint32 varint longer than 5 bytes MUST be rejected. Tags and lengths are
# 32-bit too; only unknown varint fields and the bool may use the full 10 bytes of a 64-bit one.
_UINT32_VARINT_BYTES = 5
_UINT64_VARINT_BYTES = 10


def _decode_protobuf_payload(payload: bytes) -> Frame:
    ids: list[int] = []
    done = False
    finish_reason: str | None = None
    pos = 0
    end = len(payload)
    while pos < end:
        key, pos = _read_varint(payload, pos, end, _UINT32_VARINT_BYTES)
        field, wire_type = key >> 3, key & 0x07
        if field == 0:
            raise _error("protobuf field number 0")
        if field == 1 and wire_type == _LEN:  # ids, packed (codec-spec.md §1.2)
            length, pos = _read_varint(payload, pos, end, _UINT32_VARINT_BYTES)
            packed_end = _field_end(pos, length, end)
            while pos < packed_end:
                token_id, pos = _read_varint(payload, pos, packed_end, _UINT32_VARINT_BYTES)
                ids.append(_checked_uint32(token_id))
        elif field == 1 and wire_type == _VARINT:
            # Unpacked ids: valid proto3 input that the reference decoders silently drop.
            token_id, pos = _read_varint(payload, pos, end, _UINT32_VARINT_BYTES)
            ids.append(_checked_uint32(token_id))
        elif field == 2 and wire_type == _VARINT:
            flag, pos = _read_varint(payload, pos, end, _UINT64_VARINT_BYTES)
            done = flag != 0
        elif field == 3 and wire_type == _LEN:
            length, pos = _read_varint(payload, pos, end, _UINT32_VARINT_BYTES)
            text_end = _field_end(pos, length, end)
            try:
                finish_reason = payload[pos:text_end].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _error("protobuf finish_reason is not UTF-8") from exc
            pos = text_end
        elif field <= 3:
            raise _error(f"protobuf field {field} has wire type {wire_type}")
        else:
            pos = _skip_field(payload, pos, end, wire_type)
    return Frame(tuple(ids), done, finish_reason)


def _read_varint(data: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for index in range(pos, min(pos + max_bytes, end)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    if pos + max_bytes <= end:
        raise _error(f"protobuf varint longer than {max_bytes} bytes", "varint_too_long")
    raise _error("protobuf varint truncated", "truncated")


def _checked_uint32(value: int) -> int:
    if value > _MAX_UINT32:
        raise _error(f"protobuf id {value} exceeds uint32")
    return value


def _field_end(pos: int, length: int, end: int) -> int:
    if pos + length > end:
        raise _error("protobuf length-delimited field runs past the frame", "truncated")
    return pos + length


def _skip_field(data: bytes, pos: int, end: int, wire_type: int) -> int:
    if wire_type == _VARINT:
        return _read_varint(data, pos, end, _UINT64_VARINT_BYTES)[1]
    if wire_type == _I64:
        return _field_end(pos, 8, end)
    if wire_type == _LEN:
        length, pos = _read_varint(data, pos, end, _UINT32_VARINT_BYTES)
        return _field_end(pos, length, end)
    if wire_type == _I32:
        return _field_end(pos, 4, end)
    # Groups (3, 4) are not proto3; 6 and 7 are undefined.
    raise _error(f"protobuf wire type {wire_type} is not supported")
