"""The Codec tokenizer map document (schema v2, codec-spec.md §7): fields in, exact bytes out.

A client pins a map by the sha256 of the bytes it fetched (interop.md §1.5: no
canonicalisation), so the bytes must be the same every time the same tokenizer is served: keys
in a fixed order, the vocabulary in id order, compact UTF-8 JSON, nothing taken from the clock.
The digest is computed once over exactly those bytes, and every place that advertises the map
(discovery, `index.json`, `Codec-Tokenizer-Map`) uses that one digest (codec-spec.md §12 item
29).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.ids import checked_map_id
from proxy.core.maps.pretok_program import PreTokenizerProgram

MAP_VERSION = "2"
Encoder = Literal["byte_level", "metaspace"]
DictionaryFormat = Literal["msgpack", "protobuf"]

_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_DICTIONARY_FORMATS = ("msgpack", "protobuf")


@dataclass(frozen=True)
class ZstdDictionary:
    """One pre-trained zstd dictionary a map declares (`zstd_dictionaries[]`, codec-spec.md §5).

    The proxy compresses a wire format with the dictionary listed for it; `hash` is the sha256
    of the raw dictionary bytes, lowercase, as `Codec-Zstd-Dict` carries it.
    """

    format: DictionaryFormat
    url: str
    hash: str
    size_bytes: int
    trained_at: str | None = None
    corpus_summary: str | None = None

    def __post_init__(self) -> None:
        if self.format not in _DICTIONARY_FORMATS:
            raise TokenizerMapError(
                f"zstd dictionary format {self.format!r} is not one of "
                f"{', '.join(_DICTIONARY_FORMATS)}"
            )
        if not _HASH.fullmatch(self.hash):
            raise TokenizerMapError(
                f"zstd dictionary hash {self.hash!r} is not sha256:<64 lowercase hex>"
            )
        if self.size_bytes < 1:
            raise TokenizerMapError(f"zstd dictionary size {self.size_bytes} is not positive")

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "format": self.format,
            "url": self.url,
            "hash": self.hash,
            "size_bytes": self.size_bytes,
        }
        if self.trained_at is not None:
            entry["trained_at"] = self.trained_at
        if self.corpus_summary is not None:
            entry["corpus_summary"] = self.corpus_summary
        return entry


@dataclass(frozen=True)
class MapContent:
    """Everything a tokenizer contributes to its map: all fields but `id` and the dictionaries.

    `caveats` are what the map cannot say about the tokenizer (e.g. an NFC normalizer), for the
    operator's log; they never reach the document.
    """

    vocab_size: int
    vocab: Mapping[str, int]  # raw token text -> id, in id order
    encoder: Encoder
    merges: Sequence[str]  # "left right", in priority order
    pre_tokenizer_pattern: str | None
    pre_tokenizer_program: PreTokenizerProgram | None
    byte_fallback: tuple[int, int] | None  # inclusive id range of <0x00>..<0xFF>
    special_tokens: Mapping[str, int]
    published_at: str | None
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True)
class PublishedMap:
    """A map's served bytes and their sha256, computed once."""

    id: str
    body: bytes
    digest: str  # 64 lowercase hex, over exactly `body`

    @property
    def hash(self) -> str:
        return f"sha256:{self.digest}"

    @property
    def header_value(self) -> str:
        """`Codec-Tokenizer-Map: <id> sha256:<64 hex>` (the id form of WIRE-OH §3, full digest).

        codec-spec.md §11 item 4: the spec writes only `sha256:<hex>`, the overhead proposal
        adds the id and shortens the digest; the id tells a client which map to fetch, and the
        full digest is the only form every client can compare with `load_map`'s hash.
        """
        return f"{self.id} {self.hash}"


def digest_of_header(value: str | None) -> str | None:
    """The 64-hex digest a `Codec-Tokenizer-Map` value names, as a client reads it: our form
    (`<id> sha256:<hex>`, `PublishedMap.header_value`) or the spec's (`sha256:<hex>`). None
    for anything else, the proposal's shortened digests included: a client can pin a map only
    by the whole digest it hashes the map's bytes to (interop.md §1.5)."""
    if value is None:
        return None
    parts = value.split()
    if not 1 <= len(parts) <= 2 or not _HASH.fullmatch(parts[-1]):
        return None
    return parts[-1].removeprefix("sha256:")


def map_document(
    map_id: str, content: MapContent, dictionaries: Sequence[ZstdDictionary] = ()
) -> dict[str, Any]:
    """The map as a JSON object, keys in a fixed order: small fields first, then vocab, merges.

    Optional fields are left out rather than set to null, except `zstd_dictionaries`, which is
    always present so that "no dictionaries" is stated rather than implied.
    """
    document: dict[str, Any] = {
        "id": checked_map_id(map_id),
        "version": MAP_VERSION,
        "vocab_size": content.vocab_size,
        "encoder": content.encoder,
    }
    if content.pre_tokenizer_pattern is not None:
        document["pre_tokenizer_pattern"] = content.pre_tokenizer_pattern
    if content.pre_tokenizer_program is not None:
        document["pre_tokenizer_program"] = content.pre_tokenizer_program.to_json()
    if content.byte_fallback is not None:
        document["byte_fallback_start"], document["byte_fallback_end"] = content.byte_fallback
    document["special_tokens"] = dict(content.special_tokens)
    document["zstd_dictionaries"] = [entry.to_json() for entry in dictionaries]
    if content.published_at is not None:
        document["published_at"] = content.published_at
    document["vocab"] = dict(content.vocab)
    document["merges"] = list(content.merges)
    return document


def render_map(
    map_id: str, content: MapContent, dictionaries: Sequence[ZstdDictionary] = ()
) -> PublishedMap:
    """Serialize a map to its one byte form and hash it.

    Compact separators and raw UTF-8 (orjson escapes only what JSON requires), a trailing
    newline so the file `codec-proxy map generate` writes is a text file with the same bytes.
    """
    document = map_document(map_id, content, dictionaries)
    try:
        body = orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError as exc:  # orjson's JSONEncodeError: e.g. a lone surrogate in a token
        raise TokenizerMapError(f"map {map_id!r} cannot be written as JSON: {exc}") from exc
    return PublishedMap(id=document["id"], body=body, digest=hashlib.sha256(body).hexdigest())
