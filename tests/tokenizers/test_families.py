"""Invariants every loaded tokenizer keeps, whatever its source."""

from __future__ import annotations

import pytest

from tests.tokenizers.support import FAMILIES, TokenizerCache, family_path


@pytest.mark.parametrize("family", FAMILIES)
def test_special_tokens_keep_their_vocabulary_ids(family: str, load_cached: TokenizerCache) -> None:
    loaded = load_cached(family_path(family))
    assert loaded.special_tokens
    for name, index in loaded.special_tokens.items():
        assert loaded.tokenizer.token_to_id(name) == index, name
    assert all(0 <= index < loaded.vocab_size for index in loaded.eos_token_ids)
    assert loaded.eos_token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_vocab_size_counts_every_id(family: str, load_cached: TokenizerCache) -> None:
    loaded = load_cached(family_path(family))
    ids = loaded.tokenizer.get_vocab(with_added_tokens=True).values()
    assert loaded.vocab_size == max(ids) + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_text_has_no_tokens(family: str, load_cached: TokenizerCache) -> None:
    loaded = load_cached(family_path(family))
    assert loaded.tokenizer.encode("", add_special_tokens=False).ids == []
    assert loaded.tokenizer.encode_special_tokens is True
