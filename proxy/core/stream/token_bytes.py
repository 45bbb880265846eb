"""What each token ID contributes to the text a backend streams: its raw bytes.

Backend-reported IDs are checked against the streamed text (proxy/core/stream/backend_ids.py), byte
for byte, so this table holds raw bytes, not decoded strings: a token can be part of a UTF-8
character (byte-level BPE splits emoji and CJK into byte tokens), which `decode()` would turn
into U+FFFD. Special tokens (`<|im_end|>`, ...) map to no bytes: llama.cpp and vLLM sample
them but do not render them (llama.cpp renders a special token only when asked to; vLLM's
default is `skip_special_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from tokenizers import Tokenizer

Encoder = Literal["byte_level", "metaspace"]

# GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves; the other 68
# bytes (controls, space, DEL, NBSP, soft hyphen, ...) are shifted to U+0100 onwards, in order.
_PRINTABLE = (*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100))


def _byte_level_alphabet() -> dict[str, int]:
    alphabet = {chr(byte): byte for byte in _PRINTABLE}
    shifted = (byte for byte in range(256) if byte not in alphabet.values())
    for offset, byte in enumerate(shifted):
        alphabet[chr(0x100 + offset)] = byte
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()
# By byte value: the character that stands for it in a byte-level vocabulary.
BYTE_LEVEL_CHARACTERS = tuple(sorted(_BYTE_LEVEL, key=_BYTE_LEVEL.__getitem__))
_METASPACE = "\u2581"


def _byte_level_bytes(piece: str) -> bytes | None:
    try:
        return bytes(_BYTE_LEVEL[char] for char in piece)
    except KeyError:
        return None  # not a byte-level piece (an added token's literal text)


def _metaspace_bytes(piece: str) -> bytes:
    # SentencePiece byte fallback pieces are spelled `<0xNN>`.
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes((int(piece[3:5], 16),))
        except ValueError:
            pass
    return piece.replace(_METASPACE, " ").encode()


class TokenBytes:
    """ID -> the bytes it renders as. Built once per tokenizer."""

    __slots__ = ("_table", "native")

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = tuple(table)
        # The same table in one C array, made by proxy/core/steady on first use.
        self.native: object | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, encoder: Encoder) -> TokenBytes:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values(), default=-1) + 1)
        for piece, token_id in vocab.items():
            raw = _byte_level_bytes(piece) if encoder == "byte_level" else _metaspace_bytes(piece)
            table[token_id] = piece.encode() if raw is None else raw
        for token_id, added in tokenizer.get_added_tokens_decoder().items():
            # Added tokens are matched as literal text; special ones are not rendered.
            table[token_id] = b"" if added.special else added.content.encode()
        return cls(table)

    @property
    def table(self) -> tuple[bytes, ...]:
        return self._table

    @property
    def vocab_size(self) -> int:
        return len(self._table)

    def joined(self, ids: Sequence[int]) -> bytes:
        """The bytes of IDs known to be in the vocabulary (the tokenizer's own), joined."""
        table = self._table
        return b"".join([table[token_id] for token_id in ids])

    def render(self, ids: Sequence[int]) -> list[bytes] | None:
        """Each ID's bytes, or None if an ID is outside the vocabulary."""
        table = self._table
        size = len(table)
        out = []
        for token_id in ids:
            if token_id >= size:
                return None
            out.append(table[token_id])
        return out
