"""The client side of the wire: an incremental decoder for a Codec response body.

The proxy itself only encodes; this decoder is what its tests, benchmarks, the `codec-proxy
client` command and the Codec clients (proxy/core/client/) read responses with, held to the same
formats as the encoders in proxy/core/wire/frames.py (codec-spec.md §1).

A decoded frame holds its IDs in an `array("I")`, 4 bytes each, never a list of Python ints (36
bytes each past 256): a server may merge thousands of tokens into one frame, and a hostile one
millions, up to the frame cap. Packed protobuf IDs are checked as bytes and decoded by the
protobuf runtime in slices (protowire.py); a msgpack frame is unpacked whole by msgpack's C
unpacker while it is small, and value by value past that, its IDs straight into the array.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import Any, Final, Literal

import msgpack

from proxy.core.errors import BadRequest
from proxy.core.wire import delta, protowire
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall, tool_call_from_map, tool_call_from_protobuf

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FrameDecodeError", "FrameDecoder"]

# The frame cap suggested for inbound protobuf length prefixes (codec-spec.md §12 item 36).
# A real frame holds a few token IDs; this bounds what a peer can make us buffer.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

_MAX_UINT32 = protowire.MAX_UINT32
_LENGTH_PREFIX = struct.Struct(">I")
# A msgpack frame up to this size is unpacked whole (a few MiB of Python objects at most);
# a larger one a value at a time.
_UNPACKED_WHOLE_BYTES: Final = 64 * 1024
# The keys of a frame's map that are read; any other is skipped unread (codec-spec.md §1.1).
_FRAME_KEYS: Final = frozenset({"done", "finish_reason", "tool_calls", "base_id"})
# Zigzag deltas of uint32 IDs reach 2**33 - 1 (delta.py).
_MAX_DELTA = 2 * _MAX_UINT32 + 1


class FrameDecodeError(BadRequest):
    """Bytes that are not a valid Codec frame stream (400: the peer sent them)."""


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


def _unpack_frame(payload: bytes, array_key: str, limit: int) -> tuple[dict[str, Any], Any]:
    """The frame's map, and its `array_key` value: an array of unsigned ints up to `limit`
    (`"I"` or `"Q"` by the limit), or whatever else it is (then not an array of IDs)."""
    typecode = "I" if limit <= _MAX_UINT32 else "Q"
    if len(payload) > _UNPACKED_WHOLE_BYTES:
        return _unpack_frame_by_values(payload, array_key, limit, typecode)
    try:
        # strict_map_key: only str/bytes keys, never an unhashable container.
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except ValueError as exc:  # also UnicodeDecodeError and msgpack's ExtraData/FormatError
        raise _error(f"invalid msgpack frame: {str(exc) or type(exc).__name__}") from exc
    if type(value) is not dict:
        raise _error(f"msgpack frame is a {type(value).__name__}, not a map")
    items = value.get(array_key)
    if type(items) is list:
        items = array(typecode, _checked_ids(items, array_key, limit))
    return value, items


def _unpack_frame_by_values(
    payload: bytes, array_key: str, limit: int, typecode: str
) -> tuple[dict[str, Any], Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(payload))
    unpacker.feed(payload)
    value: dict[str, Any] = {}
    items: Any = None
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if type(key) is not str and type(key) is not bytes:  # as strict_map_key refuses
                raise _error(f"msgpack frame has a key of type {type(key).__name__}")
            if key == array_key:
                items = _read_array(unpacker, array_key, limit, typecode)
            elif key in _FRAME_KEYS:
                value[key] = unpacker.unpack()
            else:
                unpacker.skip()
    except (ValueError, msgpack.UnpackException) as exc:
        raise _error(f"invalid msgpack frame: {str(exc) or type(exc).__name__}") from exc
    if unpacker.tell() != len(payload):
        raise _error("invalid msgpack frame: bytes after its map")
    return value, items


def _read_array(unpacker: msgpack.Unpacker, key: str, limit: int, typecode: str) -> array[int]:
    items = array(typecode)
    append, unpack = items.append, unpacker.unpack
    for _ in range(unpacker.read_array_header()):
        item = unpack()
        if type(item) is not int or not 0 <= item <= limit:
            raise _error(f"msgpack frame {key} item {item!r} is out of range")
        append(item)
    return items


def _decode_msgpack_payload(payload: bytes) -> Frame:
    # codec-spec.md §1.1 and interop.md §0.3: `ids` and `done` required, `done` a real bool,
    # `finish_reason` str or nil, unknown keys ignored.
    value, ids = _unpack_frame(payload, "ids", _MAX_UINT32)
    if type(ids) is not array:
        raise _error("msgpack frame has no `ids` array")
    return _frame_from_map(value, ids)


def _decode_msgpack_delta_payload(payload: bytes) -> Frame:
    # codec-spec.md §1.5: `{base_id, ids_delta, done, finish_reason?}`; each frame carries its
    # own base, so a frame decodes without the ones before it.
    value, deltas = _unpack_frame(payload, "ids_delta", _MAX_DELTA)
    base_id = value.get("base_id")
    if type(base_id) is not int or not 0 <= base_id <= _MAX_UINT32:
        raise _error("msgpack-delta frame has no uint32 `base_id`")
    if type(deltas) is not array:
        raise _error("msgpack-delta frame has no `ids_delta` array")
    try:
        ids = array("I", delta.decode_deltas(deltas, base_id))
    except OverflowError as exc:  # an ID below 0 or past uint32
        raise _error(f"msgpack-delta frame ids are out of range: {exc}") from exc
    return _frame_from_map(value, ids)


def _checked_ids(values: list[Any], what: str, limit: int) -> list[int]:
    for value in values:
        if type(value) is not int or not 0 <= value <= limit:
            raise _error(f"msgpack frame {what} item {value!r} is out of range")
    return values


def _frame_from_map(value: dict[str, Any], ids: array[int]) -> Frame:
    done = value.get("done")
    if type(done) is not bool:
        raise _error("msgpack frame `done` is missing or not a bool")
    finish_reason = value.get("finish_reason")
    if finish_reason is not None and type(finish_reason) is not str:
        raise _error("msgpack frame `finish_reason` is neither a str nor nil")
    calls = value.get("tool_calls")
    if calls is None:
        return Frame(ids, done, finish_reason)
    if type(calls) is not list:
        raise _error("msgpack frame `tool_calls` is not an array")
    return Frame(ids, done, finish_reason, tuple(tool_call_from_map(c, _error) for c in calls))


# --- protobuf -----------------------------------------------------------------------------


def _decode_protobuf_payload(payload: bytes) -> Frame:
    reader = protowire.WireReader(payload, _error, "bad_frame")
    ids = array("I")
    done = False
    finish_reason: str | None = None
    calls: list[ToolCall] = []
    while not reader.at_end:
        field, wire_type = reader.key()
        if field == 1 and wire_type == protowire.LEN:  # ids, packed (codec-spec.md §1.2)
            packed, _ = reader.packed_uint32(reader.length_delimited_end())
            for values in protowire.packed_slices(packed):
                ids.extend(values)
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
    return Frame(ids, done, finish_reason, tuple(calls))
