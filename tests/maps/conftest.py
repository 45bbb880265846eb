"""A tiny but real map: written as a GGUF vocabulary, loaded, and rendered like any other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.core.maps.content import map_content
from proxy.core.maps.tokenizer_map import PublishedMap, render_map
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from tests.tokenizers.support import write_gguf


@pytest.fixture(scope="session")
def tiny_loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedTokenizer:
    path = write_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", pre="llama-bpe")
    return load_tokenizer(path)


@pytest.fixture(scope="session")
def tiny_map(tiny_loaded: LoadedTokenizer) -> PublishedMap:
    content = map_content(
        tiny_loaded.tokenizer,
        encoder=tiny_loaded.encoder,
        vocab_size=tiny_loaded.vocab_size,
        special_tokens=tiny_loaded.special_tokens,
        published_at="2026-01-01T00:00:00Z",
    )
    return render_map("test/tiny", content)


@pytest.fixture
def tiny_document(tiny_map: PublishedMap) -> dict[str, Any]:
    """A fresh copy per test, to break in one way."""
    document: dict[str, Any] = json.loads(tiny_map.body)
    return document


def write_map(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return path
