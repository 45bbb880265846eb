"""The model's tokenizer, loaded once, and what every stream derives from it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from proxy.core.compression.dictionaries import vocabulary_sha256
from proxy.core.maps.tokenizer_map import MapContent
from proxy.core.stream.retokenizer import RetokenizerScheme
from proxy.core.stream.token_bytes import TokenBytes
from proxy.tokenizers.loaded import LoadedTokenizer


@dataclass(frozen=True)
class Vocabulary:
    """The model's tokenizer, loaded once, and what streams derive from it."""

    loaded: LoadedTokenizer
    scheme: RetokenizerScheme
    # Each ID's bytes, to check backend-reported IDs against the text (core/stream/backend_ids.py).
    token_bytes: TokenBytes

    @classmethod
    def build(cls, loaded: LoadedTokenizer) -> Vocabulary:
        scheme = RetokenizerScheme.from_tokenizer(loaded.tokenizer, loaded.encoder)
        return cls(loaded, scheme, scheme.token_bytes)

    @cached_property
    def map_content(self) -> MapContent:
        """The tokenizer's map fields, read once (seconds for a Llama-3-sized vocabulary)."""
        return self.loaded.map_content()

    @cached_property
    def vocabulary_sha256(self) -> str:
        """Which zstd dictionaries fit this vocabulary (core/compression/dictionaries.py).

        Hashed once per tokenizer."""
        return vocabulary_sha256(self.loaded.tokenizer.get_vocab(True))
