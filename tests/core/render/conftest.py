"""The bundled model's published map, read as a client reads it, for the renderer's tests."""

from __future__ import annotations

import pytest

from proxy.core.verify.map_decoder import MapDecoder
from proxy.maps.publish import publish
from proxy.tokenizers.vocabulary import Vocabulary


@pytest.fixture(scope="session")
def smollm2_map(smollm2_vocabulary: Vocabulary) -> MapDecoder:
    """SmolLM2's map from the bytes the proxy serves (`/.well-known/codec/maps/...`)."""
    published = publish(
        smollm2_vocabulary.loaded, "test/smollm2", content=smollm2_vocabulary.map_content
    )
    return MapDecoder.from_map(published.body)
