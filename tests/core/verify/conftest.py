"""Real tokenizers and the maps the proxy publishes for them, each built once per session.

A published map is the bytes `proxy.maps.publish.publish` renders, exactly what a client
downloads from `/.well-known/codec/maps/...`; codecai reads the same bytes as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from codecai import Detokenizer, TokenizerMap

from proxy.core.stream.retokenizer import RetokenizerScheme
from proxy.core.verify.map_decoder import MapDecoder
from proxy.maps.publish import publish
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests.tokenizers.support import family_path

# Every tokenizer file the tests fetch (tests/tokenizers/support.py FAMILIES).
MAP_FAMILIES = (
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "starcoder",
    "smollm2",
    "llama3.json",
    "qwen3.json",
    "mistral.json",
)


@dataclass(frozen=True)
class MapFamily:
    name: str
    loaded: LoadedTokenizer
    body: bytes  # the published map
    decoder: MapDecoder

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.loaded.tokenizer.encode(text, add_special_tokens=False).ids
        return ids


class Families:
    """Tokenizers, maps and retokenizer schemes, built on first use in a test session."""

    def __init__(self, smollm2: Vocabulary) -> None:
        # The bundled model's vocabulary is a session fixture already: not loaded twice.
        self._vocabularies = {"smollm2": smollm2}
        self._maps: dict[str, MapFamily] = {}
        self._schemes: dict[str, RetokenizerScheme] = {"smollm2": smollm2.scheme}
        self._detokenizers: dict[str, Detokenizer] = {}

    def map(self, name: str) -> MapFamily:
        if name not in self._maps:
            vocabulary = self._vocabularies.get(name)
            if vocabulary is not None:
                loaded = vocabulary.loaded
                published = publish(loaded, f"test/{name}", content=vocabulary.map_content)
            else:
                loaded = load_tokenizer(family_path(name))
                published = publish(loaded, f"test/{name}")
            decoder = MapDecoder.from_map(published.body)
            self._maps[name] = MapFamily(name, loaded, published.body, decoder)
        return self._maps[name]

    def detokenizer(self, name: str) -> Detokenizer:
        """codecai's reading of the same map bytes (building one takes a while): `reset()` it
        after use."""
        if name not in self._detokenizers:
            self._detokenizers[name] = Detokenizer(TokenizerMap.from_json(self.map(name).body))
        return self._detokenizers[name]

    def scheme(self, name: str) -> RetokenizerScheme:
        if name not in self._schemes:
            loaded = self.map(name).loaded
            self._schemes[name] = RetokenizerScheme.from_tokenizer(loaded.tokenizer, loaded.encoder)
        return self._schemes[name]


@pytest.fixture(scope="session")
def families(smollm2_vocabulary: Vocabulary) -> Families:
    return Families(smollm2_vocabulary)
