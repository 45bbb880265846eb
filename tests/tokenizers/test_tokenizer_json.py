"""Hugging Face tokenizer.json files load as-is and agree with llama.cpp's vectors."""

from __future__ import annotations

import json
import os
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy import assets
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.from_hf import detect_encoder
from tests.tokenizers.support import TokenizerCache, read_vectors


@pytest.mark.parametrize(
    ("asset", "vectors"),
    [(assets.LLAMA3_TOKENIZER, "llama-bpe"), (assets.QWEN3_TOKENIZER, "qwen2")],
    ids=["llama3", "qwen3"],
)
def test_tokenizer_json_reproduces_llamacpp_vectors(
    asset: assets.Asset, vectors: str, vocab_dir: Path, load_cached: TokenizerCache
) -> None:
    loaded = load_cached(asset.ensure())
    pairs = read_vectors(vocab_dir, vectors)
    mismatches = [
        (text, expected, got)
        for text, expected in pairs
        if (got := loaded.tokenizer.encode(text, add_special_tokens=False).ids) != expected
    ]
    assert mismatches == [], f"{len(mismatches)}/{len(pairs)} vectors differ"


def test_llama3_metadata(load_cached: TokenizerCache) -> None:
    path = assets.LLAMA3_TOKENIZER.ensure()
    loaded = load_cached(path)
    assert loaded.source == path
    assert loaded.source_kind == "tokenizer.json"
    assert loaded.encoder == "byte_level"
    assert loaded.vocab_size == 128256
    assert loaded.pre_type is None
    assert loaded.special_tokens["<|begin_of_text|>"] == 128000
    assert loaded.special_tokens["<|eot_id|>"] == 128009
    assert len(loaded.special_tokens) == 256
    # No generation_config.json next to the npm file: the names give it away.
    # (Llama-3.0 has no <|eom_id|>: 128008 is a reserved token there.)
    assert loaded.eos_token_ids == (128001, 128009)


def test_qwen3_metadata(load_cached: TokenizerCache) -> None:
    loaded = load_cached(assets.QWEN3_TOKENIZER.ensure())
    assert loaded.encoder == "byte_level"
    assert loaded.vocab_size == 151669
    assert loaded.special_tokens["<|im_start|>"] == 151644
    # `<think>` is an added token but not a special one: it is matched in text, not listed.
    assert "<think>" not in loaded.special_tokens
    assert loaded.tokenizer.encode("<think>", add_special_tokens=False).ids == [151667]
    assert loaded.eos_token_ids == (151643, 151645)


def test_mistral_metadata(load_cached: TokenizerCache) -> None:
    loaded = load_cached(assets.MISTRAL_TOKENIZER.ensure())
    assert loaded.encoder == "metaspace"
    assert loaded.vocab_size == 32000
    assert dict(loaded.special_tokens) == {"<unk>": 0, "<s>": 1, "</s>": 2}
    assert loaded.eos_token_ids == (2,)
    # Mistral-7B v0.1, not Llama-2 (whose "Hello" is 15043).
    assert loaded.tokenizer.encode("Hello", add_special_tokens=False).ids == [22557]


def test_special_token_text_is_encoded_as_text(load_cached: TokenizerCache) -> None:
    loaded = load_cached(assets.QWEN3_TOKENIZER.ensure())
    ids = loaded.tokenizer.encode("<|im_start|>user", add_special_tokens=False).ids
    assert 151644 not in ids
    assert loaded.tokenizer.decode(ids) == "<|im_start|>user"


def test_qwen3_normalizes_nfc_as_its_file_says(load_cached: TokenizerCache) -> None:
    # The file's NFC normalizer is kept: vLLM tokenizes with this very file.
    loaded = load_cached(assets.QWEN3_TOKENIZER.ensure())
    decomposed = "cafe\u0301"
    assert loaded.tokenizer.encode(decomposed).ids == loaded.tokenizer.encode("café").ids
    assert unicodedata.normalize("NFC", decomposed) == "café"


def test_directory_means_its_tokenizer_json(load_cached: TokenizerCache) -> None:
    path = assets.MISTRAL_TOKENIZER.ensure()
    from_dir = load_tokenizer(path.parent)
    assert from_dir.source == path
    assert from_dir.vocab_size == load_cached(path).vocab_size


def test_model_directory_configs_declare_eos(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(assets.MISTRAL_TOKENIZER.ensure())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<s>"}}))
    assert load_tokenizer(tmp_path).eos_token_ids == (2, 0, 1)


def test_published_at_is_the_file_mtime_in_utc(tmp_path: Path) -> None:
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(assets.MISTRAL_TOKENIZER.ensure().read_bytes())
    mtime = datetime(2026, 11, 29, 19, 32, 55, 750_000, tzinfo=UTC).timestamp()
    os.utime(copy, (mtime, mtime))
    assert load_tokenizer(copy).published_at == "2026-11-29T19:32:55Z"


@pytest.mark.parametrize(
    ("document", "encoder"),
    [
        ({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}}, "metaspace"),
        (
            {
                "normalizer": {
                    "type": "Sequence",
                    "normalizers": [
                        {"type": "Prepend", "prepend": "\u2581"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                    ],
                }
            },
            "metaspace",
        ),
        ({"model": {"type": "BPE", "byte_fallback": True}}, "metaspace"),
        (
            {
                "pre_tokenizer": {"type": "ByteLevel"},
                "model": {"type": "BPE", "byte_fallback": True},
            },
            "byte_level",
        ),
        (
            {
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel"}],
                }
            },
            "byte_level",
        ),
        ({"normalizer": {"type": "NFC"}}, "byte_level"),
    ],
    ids=["metaspace", "replace-space", "byte-fallback", "bytelevel-wins", "sequence", "plain"],
)
def test_detect_encoder(document: dict[str, Any], encoder: str) -> None:
    assert detect_encoder(document) == encoder
