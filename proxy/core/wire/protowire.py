"""Reading the protobuf wire format by hand, strictly: the parts Codec frames and requests use.

Hand-written rather than `codec_pb2.FromString` because the generated parser is lenient where
the Codec I-D is strict (§ Security: a uint32 varint longer than 5 bytes MUST be rejected;
truncation is an error, never "the rest defaults"), and because its errors do not say what was
wrong. Callers pass the error factory, so a frame decoder and a request decoder each raise
their own `BadRequest` subclass with their own message prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final

from proxy.core.wire import codec_pb2

VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
I32: Final = 5

# I-D § Security: a uint32 varint longer than 5 bytes MUST be rejected. Tags and lengths are
# 32-bit too; only unknown varint fields and bools may use the 10 bytes of a 64-bit varint.
UINT32_VARINT_BYTES: Final = 5
UINT64_VARINT_BYTES: Final = 10
MAX_UINT32: Final = 0xFFFFFFFF

# Bytes per scan of a packed field (translate, count): a millisecond or two each.
SCAN_BYTES: Final = 1 << 20
# A packed uint32 field, byte by byte (I-D § Security): "c" continues a varint, "s" ends one and
# would keep a fifth byte within 32 bits (<= 0x0F), "b" ends one with more than that.
_PACKED_CLASSES: Final = bytes(
    ord("c" if byte >= 0x80 else "s" if byte <= 0x0F else "b") for byte in range(256)
)

# (message, code) -> the exception to raise; codes: "truncated", "varint_too_long", or the
# caller's generic code for anything else.
ErrorFactory = Callable[[str, str], Exception]


class WireReader:
    """A cursor over one protobuf message's bytes."""

    __slots__ = ("_data", "_end", "_error", "_generic", "pos")

    def __init__(self, data: bytes, error: ErrorFactory, generic_code: str) -> None:
        self._data = data
        self._end = len(data)
        self._error = error
        self._generic = generic_code
        self.pos = 0

    @property
    def at_end(self) -> bool:
        return self.pos >= self._end

    def fail(self, message: str, code: str | None = None) -> Exception:
        return self._error(message, code or self._generic)

    def key(self) -> tuple[int, int]:
        """The next field's (number, wire type)."""
        key = self.varint(UINT32_VARINT_BYTES)
        field = key >> 3
        if field == 0:
            raise self.fail("protobuf field number 0")
        return field, key & 0x07

    def varint(self, max_bytes: int, end: int | None = None) -> int:
        data = self._data
        pos = self.pos
        limit = self._end if end is None else end
        value = 0
        shift = 0
        for index in range(pos, min(pos + max_bytes, limit)):
            byte = data[index]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = index + 1
                return value
            shift += 7
        if pos + max_bytes <= limit:
            raise self.fail(f"protobuf varint longer than {max_bytes} bytes", "varint_too_long")
        raise self.fail("protobuf varint truncated", "truncated")

    def uint32(self, end: int | None = None) -> int:
        value = self.varint(UINT32_VARINT_BYTES, end)
        if value > MAX_UINT32:
            raise self.fail(f"protobuf value {value} exceeds uint32")
        return value

    def packed_uint32(self, end: int) -> tuple[bytes, int]:
        """A packed repeated uint32 field up to `end`: its bytes and how many values they hold.

        Checked as bytes, without decoding a value (millions of IDs must not mean millions of
        Python steps): every varint ends inside the field, none is longer than 5 bytes, none is
        over 32 bits. A varint is its continuation bytes (>= 0x80) and one last byte, so the
        count is the bytes below 0x80, and an over-long or over-large one is a run of classes.
        Scanned a window at a time, each overlapping the next by the 4 bytes a run can span.
        """
        packed = self.take(end)
        if packed and packed[-1] >= 0x80:
            raise self.fail("protobuf varint truncated", "truncated")
        continuations = 0
        for window in range(0, len(packed), SCAN_BYTES):
            classes = packed[window : window + SCAN_BYTES + 4].translate(_PACKED_CLASSES)
            if b"c" * UINT32_VARINT_BYTES in classes:
                raise self.fail(
                    f"protobuf varint longer than {UINT32_VARINT_BYTES} bytes", "varint_too_long"
                )
            if b"ccccb" in classes:
                raise self.fail("protobuf value exceeds uint32")
            continuations += classes.count(b"c", 0, SCAN_BYTES)
        return packed, len(packed) - continuations

    def length_delimited_end(self) -> int:
        """Read a length; return where that many bytes end (checked against the message)."""
        length = self.varint(UINT32_VARINT_BYTES)
        return self.field_end(length)

    def field_end(self, length: int) -> int:
        if self.pos + length > self._end:
            raise self.fail("protobuf field runs past the end of the message", "truncated")
        return self.pos + length

    def take(self, end: int) -> bytes:
        chunk = self._data[self.pos : end]
        self.pos = end
        return chunk

    def text(self, what: str) -> str:
        """A length-delimited UTF-8 string field (proto3 `string`)."""
        raw = self.take(self.length_delimited_end())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"protobuf {what} is not UTF-8") from exc

    def skip(self, wire_type: int) -> None:
        """Skip an unknown field's value (proto3: unknown fields are ignored)."""
        if wire_type == VARINT:
            self.varint(UINT64_VARINT_BYTES)
        elif wire_type == I64:
            self.pos = self.field_end(8)
        elif wire_type == LEN:
            self.pos = self.length_delimited_end()
        elif wire_type == I32:
            self.pos = self.field_end(4)
        else:
            # Groups (3, 4) are not proto3; 6 and 7 are undefined.
            raise self.fail(f"protobuf wire type {wire_type} is not supported")


# Packed values are decoded this many bytes at a time (a few milliseconds each), so a worker
# thread decoding a long prompt hands the interpreter back to the event loop between them.
PACKED_SLICE_BYTES: Final = 64 * 1024


def packed_slices(packed: bytes) -> Iterator[Sequence[int]]:
    """The values of packed varints that `WireReader.packed_uint32` checked, a slice at a time.

    Decoded by the protobuf runtime's C parser, which is lenient only where the bytes were
    already checked, in slices cut after a varint's last byte (as `CodecFrame.ids`, field 1,
    packed uint32: any such field reads the same).
    """
    start = 0
    while start < len(packed):
        end = min(start + PACKED_SLICE_BYTES, len(packed))
        while packed[end - 1] >= 0x80:  # the checks left a last byte within 5 of any byte
            end += 1
        piece = packed[start:end]
        yield codec_pb2.CodecFrame.FromString(b"\x0a" + varint(len(piece)) + piece).ids
        start = end


_ONE_BYTE: Final = tuple(bytes((value,)) for value in range(0x80))


def varint(value: int) -> bytes:
    """Encode a non-negative integer as a protobuf varint."""
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
