"""Pre-trained zstd dictionaries: what one is, how it is named, and the manifest that lists them.

codec-spec.md §5: a dictionary belongs to one wire format (msgpack and protobuf dictionaries
are not interchangeable); it is named by `sha256:` + the 64 lowercase hex digits of its raw
bytes (the `Codec-Zstd-Dict` header, which codecai checks at exactly 71 characters); it is
published at `/.well-known/codec/dicts/<hex>.zstd`; and the tokenizer map lists it in
`zstd_dictionaries[]` as `{format, url, hash, size_bytes, trained_at?, corpus_summary?}`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import zstandard

from proxy.core.errors import ProxyError
from proxy.core.maps.tokenizer_map import DictionaryFormat, ZstdDictionary

WIRE_FORMATS: Final = ("msgpack", "protobuf")
DICTS_PATH: Final = "/.well-known/codec/dicts/"
DEFAULT_ZSTD_LEVEL: Final = 3
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


class DictionaryError(ProxyError):
    """A dictionary or its manifest is unusable; the proxy refuses to start (WKD v0.5)."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dictionary_url(hex_digest: str) -> str:
    """Where the dictionary is served, relative to the proxy's origin (WKD v0.5 `dicts/`)."""
    return f"{DICTS_PATH}{hex_digest}.zstd"


def is_sha256_hex(value: str) -> bool:
    return _HEX64.fullmatch(value) is not None


@dataclass(frozen=True)
class LoadedZstdDictionary:
    """A dictionary ready to compress with: its record, raw bytes, and the prepared zstd form."""

    record: ZstdDictionary
    data: bytes = field(repr=False)
    zstd_dict: zstandard.ZstdCompressionDict = field(repr=False, compare=False)
    level: int = DEFAULT_ZSTD_LEVEL

    @property
    def hex_digest(self) -> str:
        return self.record.hash.removeprefix("sha256:")

    @classmethod
    def build(
        cls,
        fmt: str,
        data: bytes,
        *,
        trained_at: str | None = None,
        corpus_summary: str | None = None,
        level: int = DEFAULT_ZSTD_LEVEL,
    ) -> LoadedZstdDictionary:
        if fmt not in WIRE_FORMATS:
            raise DictionaryError(f"dictionary format {fmt!r} is not one of {WIRE_FORMATS}")
        digest = sha256_hex(data)
        record = ZstdDictionary(
            format=cast(DictionaryFormat, fmt),
            url=dictionary_url(digest),
            hash=f"sha256:{digest}",
            size_bytes=len(data),
            trained_at=trained_at,
            corpus_summary=corpus_summary,
        )
        try:
            zstd_dict = zstandard.ZstdCompressionDict(data)
            # Done once at start, so each response only references it (cheap per stream).
            zstd_dict.precompute_compress(level=level)
        except zstandard.ZstdError as exc:
            raise DictionaryError(f"not a usable zstd dictionary ({fmt}): {exc}") from exc
        return cls(record, data, zstd_dict, level)


def declared_dictionaries(document: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(wire format, 64-hex sha256) of each dictionary a tokenizer map document lists in
    `zstd_dictionaries[]`, as a client of its server reads them: the `hash` is what it fetches
    by (its `url` is the server's idea of its own origin); entries for a format it does not
    know, or without a whole lowercase digest, are skipped."""
    entries = document.get("zstd_dictionaries")
    declared: list[tuple[str, str]] = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict):
            continue
        fmt, hash_ = entry.get("format"), entry.get("hash")
        if fmt not in WIRE_FORMATS or not isinstance(hash_, str):
            continue
        digest = hash_.removeprefix("sha256:")
        if hash_.startswith("sha256:") and is_sha256_hex(digest):
            declared.append((fmt, digest))
    return tuple(declared)


class ZstdDictionaries:
    """The loaded dictionaries, at most one per wire format; immutable once built."""

    __slots__ = ("_by_format", "_by_hex")

    def __init__(self, dictionaries: Iterable[LoadedZstdDictionary] = ()) -> None:
        by_format: dict[str, LoadedZstdDictionary] = {}
        for dictionary in dictionaries:
            fmt = dictionary.record.format
            if fmt in by_format:
                raise DictionaryError(f"two zstd dictionaries for format {fmt!r}")
            by_format[fmt] = dictionary
        self._by_format: Mapping[str, LoadedZstdDictionary] = by_format
        self._by_hex: Mapping[str, LoadedZstdDictionary] = {
            d.hex_digest: d for d in by_format.values()
        }

    def for_format(self, fmt: str) -> LoadedZstdDictionary | None:
        return self._by_format.get(fmt)

    def by_hex(self, hex_digest: str) -> LoadedZstdDictionary | None:
        return self._by_hex.get(hex_digest)

    @property
    def records(self) -> tuple[ZstdDictionary, ...]:
        """For the tokenizer map's `zstd_dictionaries[]`, in format order."""
        return tuple(self._by_format[f].record for f in WIRE_FORMATS if f in self._by_format)

    def __len__(self) -> int:
        return len(self._by_format)


# --- dictionaries/manifest.json --------------------------------------------------------------


@dataclass(frozen=True)
class ManifestEntry:
    """One trained dictionary as `dictionaries/manifest.json` describes it."""

    file: str
    format: str
    sha256: str  # 64 lowercase hex
    size_bytes: int
    tokenizer: str
    trained_at: str | None
    corpus_summary: str | None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "tokenizer": self.tokenizer,
            "trained_at": self.trained_at,
            "corpus_summary": self.corpus_summary,
            **self.extra,
        }


_ENTRY_KEYS: Final = frozenset(
    {"file", "format", "sha256", "size_bytes", "tokenizer", "trained_at", "corpus_summary"}
)


def parse_manifest(text: str, *, source: str = "manifest") -> list[ManifestEntry]:
    """The entries of a manifest; `DictionaryError` naming `source` if it is malformed."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise DictionaryError(f"{source} is not valid JSON: {exc}") from exc
    raw_entries = document.get("dictionaries") if isinstance(document, dict) else None
    if not isinstance(raw_entries, list):
        raise DictionaryError(f"{source} has no 'dictionaries' list")
    entries = []
    for index, raw in enumerate(raw_entries):
        where = f"{source} dictionaries[{index}]"
        if not isinstance(raw, dict):
            raise DictionaryError(f"{where} is not an object")
        entries.append(_manifest_entry(raw, where))
    return entries


def _manifest_entry(raw: dict[str, Any], where: str) -> ManifestEntry:
    for key, kind in (("file", str), ("format", str), ("sha256", str), ("tokenizer", str)):
        if not isinstance(raw.get(key), kind):
            raise DictionaryError(f"{where}: '{key}' must be a string")
    size = raw.get("size_bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise DictionaryError(f"{where}: 'size_bytes' must be a positive integer")
    if raw["format"] not in WIRE_FORMATS:
        raise DictionaryError(f"{where}: format {raw['format']!r} is not one of {WIRE_FORMATS}")
    if not is_sha256_hex(raw["sha256"]):
        raise DictionaryError(f"{where}: 'sha256' must be 64 lowercase hex digits")
    optional = {key: raw.get(key) for key in ("trained_at", "corpus_summary")}
    for key, value in optional.items():
        if value is not None and not isinstance(value, str):
            raise DictionaryError(f"{where}: '{key}' must be a string")
    trained_at = optional["trained_at"]
    if trained_at is not None and not _RFC3339.fullmatch(trained_at):
        # The tokenizer map schema types it as an RFC 3339 date-time (TM schema v2).
        raise DictionaryError(f"{where}: 'trained_at' {trained_at!r} is not an RFC 3339 date-time")
    return ManifestEntry(
        file=raw["file"],
        format=raw["format"],
        sha256=raw["sha256"],
        size_bytes=size,
        tokenizer=raw["tokenizer"],
        trained_at=optional["trained_at"],
        corpus_summary=optional["corpus_summary"],
        extra={k: v for k, v in raw.items() if k not in _ENTRY_KEYS},
    )


def render_manifest(entries: Iterable[ManifestEntry]) -> str:
    ordered = sorted(entries, key=lambda e: (e.format, e.file))
    return json.dumps({"dictionaries": [e.to_json() for e in ordered]}, indent=2) + "\n"


def vocabulary_sha256(vocab: Mapping[str, int]) -> str:
    """Which tokenizer a dictionary was trained for: sha256 of the tokens in ID order.

    Dictionaries hold ID byte patterns, so they fit the vocabulary, not the model name.
    """
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    return sha256_hex("\n".join(f"{token_id}\t{token}" for token, token_id in ordered).encode())
