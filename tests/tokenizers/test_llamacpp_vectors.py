"""GGUF-converted tokenizers reproduce llama.cpp's own tokenizer test vectors, string for string.

llama.cpp generated `models/ggml-vocab-<name>.gguf.out` from the real Hugging Face tokenizers
and checks its C++ tokenizer against them; we hold our conversion to the same standard.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.tokenizers import TokenizerLoadError, load_tokenizer
from tests.tokenizers.support import TokenizerCache, read_vectors

# GGUF name -> its `tokenizer.ggml.pre`, which selects our pre-tokenizer rule.
GGUF_VOCABS = {
    "gpt-2": "gpt-2",
    "llama-bpe": "llama-bpe",
    "qwen2": "qwen2",
    "starcoder": "starcoder",
}


@pytest.mark.parametrize("name", GGUF_VOCABS)
def test_gguf_reproduces_every_vector(
    name: str, vocab_dir: Path, load_cached: TokenizerCache
) -> None:
    loaded = load_cached(vocab_dir / f"ggml-vocab-{name}.gguf")
    assert loaded.source_kind == "gguf"
    assert loaded.pre_type == GGUF_VOCABS[name]
    vectors = read_vectors(vocab_dir, name)
    assert len(vectors) >= 40
    mismatches = [
        (text, expected, got)
        for text, expected in vectors
        if (got := loaded.tokenizer.encode(text, add_special_tokens=False).ids) != expected
    ]
    assert mismatches == [], f"{len(mismatches)}/{len(vectors)} vectors differ"


def test_llama_spm_is_refused(vocab_dir: Path) -> None:
    path = vocab_dir / "ggml-vocab-llama-spm.gguf"
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(path)
    message = info.value.message
    assert str(path) in message
    assert "unsupported GGUF tokenizer model 'llama' (SentencePiece)" in message
    assert "\n" not in message
    assert info.value.status_hint == 500
