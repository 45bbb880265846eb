"""What a successful load hands to the rest of the proxy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer

from proxy.core.maps.content import map_content
from proxy.core.maps.tokenizer_map import MapContent

SourceKind = Literal["gguf", "tokenizer.json", "codec-map"]
Encoder = Literal["byte_level", "metaspace"]


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer configured to reproduce the backend's own tokenization of plain text.

    `tokenizer.encode(text, add_special_tokens=False).ids` equals what the backend's `/tokenize`
    returns without special-token parsing (llama.cpp: `parse_special: false`).
    `encode_special_tokens` is on, so a control token's text (`<|im_start|>`) inside generated
    text is tokenized as ordinary text, as the model itself would have produced it.
    """

    tokenizer: Tokenizer
    source: Path
    source_kind: SourceKind
    encoder: Encoder
    vocab_size: int  # number of ids: max(id) + 1 over the vocabulary and the added tokens
    pre_type: str | None  # GGUF `tokenizer.ggml.pre`; None for tokenizer.json
    special_tokens: Mapping[str, int]  # control / special added tokens, name -> id
    eos_token_ids: tuple[int, ...]  # may be empty when the source does not say
    published_at: str | None  # source file mtime, UTC, ISO 8601 with a trailing "Z"
    # A Codec map names itself; other sources leave the map id to the operator.
    map_id: str | None = None

    def map_content(self) -> MapContent:
        """The map fields of this tokenizer, `published_at` from its source (file time or the
        map's own). Seconds for a Llama-3-sized vocabulary: `Vocabulary` reads it once."""
        return map_content(
            self.tokenizer,
            encoder=self.encoder,
            vocab_size=self.vocab_size,
            special_tokens=self.special_tokens,
            published_at=self.published_at,
        )
