"""Each token ID's bytes as a client renders them from the published map alone.

codec-spec.md §12 item 34: the IDs of a stream, decoded with the served map, reproduce the text
the backend generated. A verifier that decoded with the `tokenizers` object the IDs came from
would agree with the retokenizer by construction; this table is built from the map's JSON
bytes, the way a map-driven client builds its own (interop.md §1: codecai's `Detokenizer`):

* `byte_level` (GPT-2, Llama-3, Qwen, SmolLM2): every character of a vocab entry stands for
  one byte through GPT-2's byte↔unicode alphabet; a character outside it stands for its own
  UTF-8 (an added token's literal text).
* `metaspace` (SentencePiece): `▁` is a space; `<0xNN>` entries are not text.
* IDs in `byte_fallback_start..end` are the byte `id - start`, whatever their entry says.
* Special tokens render as nothing (a client renders them only when asked to).
* An ID the map does not know renders as U+FFFD: no streamed text can match it.
* `vocab_size` says how many IDs the map has (codec-spec.md §7: valid IDs are `0 ..
  vocab_size-1`), at least one past the highest it lists; without it, one past that.

Built once per map (per model, at start): a tuple indexed by ID, so a stream's lookups are
C-level indexing and joins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from proxy.core.errors import TokenizerMapError

METASPACE: Final = "\u2581"
_FALLBACK_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_ENCODERS = ("byte_level", "metaspace", None)


def _byte_level_alphabet() -> dict[str, int]:
    # GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
    # space, DEL, NBSP, soft hyphen) for U+0100 onwards, in byte order.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {chr(byte): byte for byte in printable}
    shifted = (byte for byte in range(256) if chr(byte) not in alphabet)
    alphabet.update((chr(0x100 + offset), byte) for offset, byte in enumerate(shifted))
    return alphabet


_ALPHABET: Final = _byte_level_alphabet()


def _byte_level_piece(token: str) -> bytes | None:
    alphabet = _ALPHABET
    try:
        return bytes([alphabet[char] for char in token])
    except KeyError:
        pass
    # A character outside the alphabet stands for its own UTF-8 (added tokens' literal text).
    out = bytearray()
    for char in token:
        byte = alphabet.get(char)
        if byte is not None:
            out.append(byte)
        else:
            encoded = _utf8(char)
            if encoded is None:
                return None
            out += encoded
    return bytes(out)


def _utf8(text: str) -> bytes | None:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON `\ud800`): no text can match it
        return None


def _ids(field: Any, name: str) -> Mapping[str, int]:
    if field is None:
        return {}
    if not isinstance(field, dict) or not all(
        type(index) is int and index >= 0 for index in field.values()
    ):
        raise TokenizerMapError(f"tokenizer map `{name}` is not an object of non-negative ids")
    return field


class MapDecoder:
    """ID -> the bytes a client renders for it. One per published map."""

    __slots__ = ("digest", "encoder", "map_id", "special", "table", "vocab_size")

    def __init__(
        self,
        table: Iterable[bytes | None],
        special: Iterable[int],
        *,
        encoder: str | None,
        map_id: str = "",
        vocab_size: int | None = None,
        digest: str = "",
    ) -> None:
        # By ID: the bytes; None for a special token (renders nothing) or an unknown ID (can
        # match nothing), so both leave the joined fast path (`special` tells them apart).
        self.table: tuple[bytes | None, ...] = tuple(table)
        self.special: frozenset[int] = frozenset(special)
        self.encoder = encoder
        self.map_id = map_id
        # A map whose `vocab_size` is below an ID it lists is read as codecai reads it: the
        # listed ID renders.
        self.vocab_size = max(vocab_size or 0, len(self.table))
        self.digest = digest  # the sha256 of the map's bytes, when known

    @classmethod
    def from_map(cls, body: bytes) -> MapDecoder:
        """The decoder of a map's published JSON bytes (TokenizerMapError if it is none)."""
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise TokenizerMapError(f"tokenizer map is not JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise TokenizerMapError("tokenizer map is not a JSON object")
        return cls.from_document(document)

    @classmethod
    def from_document(cls, document: Mapping[str, Any], *, digest: str = "") -> MapDecoder:
        encoder = document.get("encoder")
        if encoder not in _ENCODERS:
            raise TokenizerMapError(f"tokenizer map encoder {encoder!r} is not known")
        vocab = _ids(document.get("vocab"), "vocab")
        special = _ids(document.get("special_tokens"), "special_tokens")
        start, end = document.get("byte_fallback_start"), document.get("byte_fallback_end")
        fallback = range(0)
        if start is not None or end is not None:
            if (
                type(start) is not int
                or type(end) is not int
                or not 0 <= start <= end < start + 256
            ):
                raise TokenizerMapError(
                    "tokenizer map byte_fallback_start..end is not a range of at most 256 ids"
                )
            fallback = range(start, end + 1)
        pieces: dict[int, bytes | None] = {}
        if encoder == "byte_level":
            for token, index in vocab.items():
                pieces[index] = _byte_level_piece(token)
        else:
            for token, index in vocab.items():
                # `<0xNN>` entries are bytes only through the fallback range, never text.
                if not _FALLBACK_PIECE.fullmatch(token):
                    text = token.replace(METASPACE, " ") if encoder == "metaspace" else token
                    pieces[index] = _utf8(text)
            # Schema v1's `tokens` (id string -> decoded text) add to and override `vocab`.
            tokens = document.get("tokens")
            if isinstance(tokens, dict):
                for key, text in tokens.items():
                    if isinstance(text, str) and key.isdecimal():
                        pieces[int(key)] = _utf8(text)
        size = max([*pieces, *special.values(), *fallback, -1]) + 1
        table: list[bytes | None] = [None] * size
        for index, piece in pieces.items():
            table[index] = piece
        specials = set(special.values())
        for index in specials:
            table[index] = None
        # The fallback range wins over everything, special tokens included.
        for index in fallback:
            table[index] = bytes((index - fallback.start,))
        specials.difference_update(fallback)
        map_id = document.get("id")
        named = map_id if isinstance(map_id, str) else ""
        vocab_size = document.get("vocab_size")
        if vocab_size is not None and (type(vocab_size) is not int or vocab_size < 1):
            raise TokenizerMapError("tokenizer map vocab_size is not a positive integer")
        return cls(
            table, specials, encoder=encoder, map_id=named, vocab_size=vocab_size, digest=digest
        )

    @property
    def size(self) -> int:
        """One past the highest ID the map gives bytes or a special meaning to."""
        return len(self.table)

    @property
    def name(self) -> str:
        """The map as a message names it: its id, and its digest when known (as
        `Codec-Tokenizer-Map` writes them)."""
        named = self.map_id or "(no id)"
        return f"{named} sha256:{self.digest}" if self.digest else named

    @property
    def dummy_prefix(self) -> bool:
        """SentencePiece prepends `▁` to a text: a metaspace stream's first space may be it."""
        return self.encoder == "metaspace"

    def piece(self, token_id: int) -> bytes | None:
        """The bytes `token_id` renders as: b"" for a special token, None for an unknown ID."""
        if 0 <= token_id < len(self.table):
            piece = self.table[token_id]
            if piece is not None:
                return piece
        return b"" if token_id in self.special else None
