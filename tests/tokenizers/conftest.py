"""Fixtures for the tokenizer tests: cached real tokenizer files, each loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import assets
from proxy.tokenizers import LoadedTokenizer
from tests.tokenizers.support import MapCache, TokenizerCache


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """llama.cpp's vocabulary-only GGUFs and their test vectors."""
    return assets.llamacpp_vocab_dir()


@pytest.fixture(scope="session")
def load_cached() -> TokenizerCache:
    """`load_tokenizer`, memoised for the session: each real file takes up to a second."""
    return TokenizerCache()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path, load_cached: TokenizerCache) -> LoadedTokenizer:
    return load_cached(smollm2_gguf)


@pytest.fixture(scope="session")
def family_maps(load_cached: TokenizerCache, tmp_path_factory: pytest.TempPathFactory) -> MapCache:
    """Each map family's map and its reloaded tokenizer, built once per session."""
    return MapCache(load_cached, tmp_path_factory.mktemp("maps"))
