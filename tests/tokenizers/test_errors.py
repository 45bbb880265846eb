"""Every way a tokenizer source can be wrong ends in one TokenizerLoadError line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.core.errors import ProxyError
from proxy.tokenizers import TokenizerLoadError, load_tokenizer
from tests.tokenizers.support import TinyVocab, write_gguf


def load_error(path: Path) -> TokenizerLoadError:
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(path)
    error = info.value
    assert isinstance(error, ProxyError)
    assert error.status_hint == 500
    assert "\n" not in error.message
    assert error.message == str(error)
    return error


def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.gguf"
    assert load_error(path).message == f"{path}: no such file or directory"


def test_directory_without_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert load_error(tmp_path).message == f"{tmp_path}: directory has no tokenizer.json"


def test_garbage_with_gguf_suffix(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * 4)
    assert load_error(path).message == f"{path}: not a GGUF file (bad magic)"


def test_empty_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"")
    assert load_error(path).message == f"{path}: empty file"


def test_truncated_gguf(tmp_path: Path, vocab_dir: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes((vocab_dir / "ggml-vocab-gpt-2.gguf").read_bytes()[:300_000])
    message = load_error(path).message
    assert message.startswith(f"{path}: ")
    assert "past the file" in message or "truncated" in message


def test_json_that_is_not_a_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 32000}))
    assert load_error(path).message == (
        f"{path}: JSON is not a tokenizer: neither a Hugging Face tokenizer.json ('model') "
        "nor a Codec tokenizer map ('vocab_size' and 'vocab') (top-level keys: architectures, "
        "vocab_size)"
    )


def test_json_array_is_not_a_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("[1, 2, 3]")
    assert load_error(path).message == f"{path}: JSON top level is list, not an object"


def test_invalid_json_is_translated_once(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": ')
    error = load_error(path)
    assert error.message.startswith(f"{path}: not valid JSON (Expecting value: line 1")
    assert isinstance(error.__cause__, json.JSONDecodeError)


def test_binary_file_that_is_neither(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert load_error(path).message == (
        f"{path}: neither a GGUF file nor UTF-8 JSON (byte 0 is not UTF-8)"
    )


def test_broken_tokenizer_json(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "NoSuchModel", "vocab": {"a": 0}}}))
    error = load_error(path)
    assert error.message.startswith(f"{path}: not a loadable tokenizer.json: ")
    assert error.__cause__ is not None


def test_gguf_without_tokenizer_metadata(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "weights-only.gguf", model=None)
    assert load_error(path).message == (
        f"{path}: GGUF has no tokenizer metadata (tokenizer.ggml.model is missing)"
    )


def test_unsupported_gguf_pre_tokenizer(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", pre="deepseek-coder")
    assert load_error(path).message == (
        f"{path}: unsupported GGUF pre-tokenizer type 'deepseek-coder' (supported: gpt-2, "
        "phi-2, llama-bpe, llama3, llama-v3, qwen2, deepseek-r1-qwen, smollm, starcoder, refact)"
    )


def test_gguf_without_pre_tokenizer(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", pre=None)
    assert load_error(path).message.startswith(f"{path}: GGUF has no tokenizer.ggml.pre; ")


def test_unsupported_gguf_model(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", model="bert")
    assert load_error(path).message == (
        f"{path}: unsupported GGUF tokenizer model 'bert' (WordPiece); "
        "only 'gpt2' (byte-level BPE) is supported"
    )


def test_merge_of_non_tokens(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", vocab=TinyVocab(merges=["h e", "zz q"]))
    assert load_error(path).message == (
        f"{path}: inconsistent BPE vocabulary: "
        "Error while initializing BPE: Token `zz` out of vocabulary"
    )


def test_merge_into_a_non_token(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", vocab=TinyVocab(merges=["h e", "h x"]))
    assert load_error(path).message.endswith("Token `hx` out of vocabulary")


def test_rust_panic_is_translated(tmp_path: Path) -> None:
    # With only one-byte tokens, tokenizers 0.23 panics on a merge into a non-token instead of
    # returning an error; pyo3 raises that as PanicException, a BaseException.
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = TinyVocab(tokens=letters, merges=["a b"], control=(), user_defined=())
    error = load_error(write_gguf(tmp_path / "model.gguf", vocab=vocab))
    assert error.message.startswith(f"{tmp_path / 'model.gguf'}: inconsistent BPE vocabulary: ")
    assert error.__cause__ is not None
    assert type(error.__cause__).__name__ == "PanicException"


def test_merge_without_separator(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", vocab=TinyVocab(merges=["he"]))
    assert load_error(path).message == f"{path}: merge 'he' has no space between its two parts"
