"""SmolLM2's GGUF, converted by us, tokenizes exactly like the live llama.cpp server running it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from proxy.tokenizers import LoadedTokenizer
from proxy.tokenizers.probes import PROBE_STRINGS
from tests.tokenizers.support import read_vectors

pytestmark = pytest.mark.backend

VECTOR_SETS = ("gpt-2", "llama-bpe", "qwen2", "starcoder", "llama-spm")


def server_tokenize(base_url: str, text: str) -> list[int]:
    """llama.cpp's `/tokenize` with special-token parsing off, as the proxy will compare."""
    body = json.dumps({"content": text, "add_special": False, "parse_special": False}).encode()
    request = urllib.request.Request(
        f"{base_url}/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        tokens: list[int] = json.load(response)["tokens"]
    return tokens


def test_smollm2_matches_llamacpp_server_on_every_probe(
    llama_server: str, smollm2: LoadedTokenizer, vocab_dir: Path
) -> None:
    # The probes plus every input of llama.cpp's own vector files (they are plain strings).
    texts = dict.fromkeys(PROBE_STRINGS)
    for name in VECTOR_SETS:
        texts.update(dict.fromkeys(text for text, _ in read_vectors(vocab_dir, name)))
    assert len(texts) >= 120
    mismatches = [
        (text, expected, got)
        for text in texts
        if (got := smollm2.tokenizer.encode(text, add_special_tokens=False).ids)
        != (expected := server_tokenize(llama_server, text))
    ]
    assert mismatches == [], f"{len(mismatches)}/{len(texts)} strings differ"


def test_smollm2_metadata(smollm2: LoadedTokenizer, llama_server: str) -> None:
    assert smollm2.source_kind == "gguf"
    assert smollm2.pre_type == "smollm"
    assert smollm2.encoder == "byte_level"
    assert smollm2.vocab_size == 49152
    assert smollm2.special_tokens["<|im_start|>"] == 1
    assert smollm2.special_tokens["<|im_end|>"] == 2
    assert smollm2.eos_token_ids == (2,)
    # The server parses control tokens only when asked; we never do.
    assert server_tokenize(llama_server, "<|im_end|>") != [2]
    assert smollm2.tokenizer.encode("<|im_end|>", add_special_tokens=False).ids != [2]
