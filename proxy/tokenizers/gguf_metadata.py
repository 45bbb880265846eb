"""Read the key/value metadata block of a GGUF file, fast.

`gguf.GGUFReader` builds one numpy view per array element while it opens a file, which costs
5 s for GPT-2's 50k-token vocabulary and 22 s for Llama-3's 128k tokens and 280k merges on the
build machine. The tokenizer needs only the metadata at the start of the file, so this module
walks that block itself: numeric arrays become one `numpy.frombuffer` copy each, string arrays one
tight loop, and keys the caller did not ask for are skipped without decoding. The file is
memory-mapped, so a multi-gigabyte model costs only the pages of its header.

The layout follows the GGUF specification (versions 2 and 3, either byte order); the value type
codes come from the `gguf` package.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from gguf import GGUF_MAGIC, GGUFValueType

from proxy.tokenizers.errors import TokenizerLoadError, one_line

GgufValue: TypeAlias = "int | float | bool | str | list[str] | npt.NDArray[Any] | list[GgufValue]"

_SUPPORTED_VERSIONS = (2, 3)
_HEADER_SIZE = 24  # magic u32, version u32, tensor count u64, key/value count u64
# Bounds that no real file comes near; they turn a corrupt count into an error instead of an
# attempt to allocate terabytes.
_MAX_KV_COUNT = 1 << 20
_MAX_ARRAY_LEN = 1 << 32

_NUMERIC_DTYPES: dict[int, str] = {
    GGUFValueType.UINT8: "u1",
    GGUFValueType.INT8: "i1",
    GGUFValueType.UINT16: "u2",
    GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4",
    GGUFValueType.INT32: "i4",
    GGUFValueType.FLOAT32: "f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "u8",
    GGUFValueType.INT64: "i8",
    GGUFValueType.FLOAT64: "f8",
}


class _Corrupt(Exception):
    """Raised inside the walk; `read_gguf_metadata` turns it into a TokenizerLoadError."""


@dataclass(frozen=True)
class GgufMetadata:
    """The requested metadata values of one GGUF file, by key."""

    path: Path
    version: int
    values: Mapping[str, GgufValue]

    def __contains__(self, key: str) -> bool:
        return key in self.values


class _Walker:
    """A cursor over the mapped bytes; one instance per file read."""

    def __init__(self, data: mmap.mmap, byte_order: str) -> None:
        self.data = data
        self.order = byte_order
        self.u32 = struct.Struct(byte_order + "I").unpack_from
        self.u64 = struct.Struct(byte_order + "Q").unpack_from
        self.offset = _HEADER_SIZE

    def _take(self, unpack: Callable[[mmap.mmap, int], tuple[int]], size: int) -> int:
        try:
            (value,) = unpack(self.data, self.offset)
        except struct.error as exc:
            raise _Corrupt(f"truncated metadata at byte {self.offset}") from exc
        self.offset += size
        return value

    def uint32(self) -> int:
        return self._take(self.u32, 4)

    def uint64(self) -> int:
        return self._take(self.u64, 8)

    def _bytes(self) -> bytes:
        length = self.uint64()
        end = self.offset + length
        if end > len(self.data):
            raise _Corrupt(f"string of {length} bytes at byte {self.offset} runs past the file")
        raw = self.data[self.offset : end]
        self.offset = end
        return raw

    def string(self) -> str:
        start = self.offset
        try:
            return self._bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"string at byte {start} is not UTF-8") from exc

    def value(self, type_code: int, keep: bool) -> GgufValue | None:
        """Read one value of `type_code`; return it only when `keep`, else just skip it."""
        if type_code == GGUFValueType.STRING:
            if keep:
                return self.string()
            self._bytes()
            return None
        if type_code == GGUFValueType.ARRAY:
            return self._array(keep)
        dtype = self._dtype(type_code)
        scalar = self._numeric(dtype, 1)
        return scalar[0].item() if keep else None

    def _dtype(self, type_code: int) -> np.dtype[Any]:
        code = _NUMERIC_DTYPES.get(type_code)
        if code is None:
            raise _Corrupt(f"unknown value type {type_code} at byte {self.offset}")
        return np.dtype(self.order + code)

    def _numeric(self, dtype: np.dtype[Any], count: int) -> npt.NDArray[Any]:
        end = self.offset + dtype.itemsize * count
        if end > len(self.data):
            raise _Corrupt(f"{count} values at byte {self.offset} run past the file")
        # One copy, converted to native byte order, so the result outlives the mapping.
        array = np.frombuffer(self.data, dtype, count, self.offset).astype(dtype.newbyteorder("="))
        self.offset = end
        return array

    def _array(self, keep: bool) -> GgufValue | None:
        item_type = self.uint32()
        count = self.uint64()
        if count > _MAX_ARRAY_LEN:
            raise _Corrupt(f"array of {count} items at byte {self.offset}")
        if item_type == GGUFValueType.STRING:
            return self._string_array(count, keep)
        if item_type == GGUFValueType.ARRAY:
            items: list[GgufValue] = []
            for _ in range(count):
                item = self._array(keep)
                if item is not None:
                    items.append(item)
            return items if keep else None
        array = self._numeric(self._dtype(item_type), count)
        return array if keep else None

    def _string_array(self, count: int, keep: bool) -> list[str] | None:
        # The hot loop of the whole load (Llama-3: 408k strings), so everything it touches is
        # a local and bounds are checked with one comparison per string.
        data, u64, offset = self.data, self.u64, self.offset
        size = len(data)
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (length,) = u64(data, offset)
                offset += 8
                end = offset + length
                if end > size:
                    raise _Corrupt(f"string at byte {offset} runs past the file")
                if keep:
                    append(data[offset:end].decode("utf-8"))
                offset = end
        except struct.error as exc:
            raise _Corrupt(f"truncated string array at byte {offset}") from exc
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"string at byte {offset} is not UTF-8") from exc
        self.offset = offset
        return out if keep else None


def _byte_order(data: mmap.mmap) -> tuple[str, int]:
    if len(data) < _HEADER_SIZE:
        raise _Corrupt(f"only {len(data)} bytes, shorter than a GGUF header")
    (magic,) = struct.unpack_from("<I", data, 0)
    if magic != GGUF_MAGIC:
        raise _Corrupt("not a GGUF file (bad magic)")
    (version,) = struct.unpack_from("<I", data, 4)
    # A big-endian file's version reads as a multiple of 65536 on a little-endian host: the
    # same test llama.cpp and gguf-py use.
    order = "<"
    if version & 0xFFFF == 0:
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if version not in _SUPPORTED_VERSIONS:
        raise _Corrupt(f"unsupported GGUF version {version}")
    return order, version


def read_gguf_metadata(path: Path, keys: Collection[str] | None = None) -> GgufMetadata:
    """Read the metadata of the GGUF file at `path`; only `keys` when given, else all.

    Raises TokenizerLoadError, naming `path`, for unreadable, truncated or malformed files.
    """
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) == 0:
                raise _Corrupt("empty file")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                order, version = _byte_order(data)
                walker = _Walker(data, order)
                (kv_count,) = struct.unpack_from(order + "Q", data, 16)
                if kv_count > _MAX_KV_COUNT:
                    raise _Corrupt(f"implausible metadata count {kv_count}")
                values: dict[str, GgufValue] = {}
                for _ in range(kv_count):
                    key = walker.string()
                    type_code = walker.uint32()
                    keep = keys is None or key in keys
                    value = walker.value(type_code, keep)
                    if keep and value is not None:
                        values[key] = value
    except _Corrupt as exc:
        raise TokenizerLoadError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise TokenizerLoadError(f"{path}: cannot read: {one_line(exc)}") from exc
    return GgufMetadata(path=path, version=version, values=values)
