"""How GGUF token types and ids become `tokenizers` behaviour, on a tiny hand-made vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFEndian

from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from tests.tokenizers.support import TinyVocab, write_gguf

VOCAB = TinyVocab()
TOKENS = VOCAB.all_tokens()
CTRL, EOS, USER = (TOKENS.index(t) for t in ("<|ctrl|>", "<|eos|>", "<user>"))
HELLO, SPACE_HELLO = TOKENS.index("hello"), TOKENS.index("Ġhello")


@pytest.fixture
def tiny(tmp_path: Path) -> LoadedTokenizer:
    return load_tokenizer(write_gguf(tmp_path / "tiny.gguf", eos_id=EOS, eot_id=CTRL))


def ids(loaded: LoadedTokenizer, text: str) -> list[int]:
    return loaded.tokenizer.encode(text, add_special_tokens=False).ids


def test_merges_apply(tiny: LoadedTokenizer) -> None:
    assert ids(tiny, "hello hello") == [HELLO, SPACE_HELLO]


def test_control_token_text_stays_text(tiny: LoadedTokenizer) -> None:
    # llama.cpp with parse_special=false never matches a CONTROL token in text.
    got = ids(tiny, "<|ctrl|>")
    assert CTRL not in got
    assert tiny.tokenizer.decode(got) == "<|ctrl|>"


def test_user_defined_token_is_matched_in_text(tiny: LoadedTokenizer) -> None:
    # llama.cpp matches USER_DEFINED tokens in text even with parse_special=false.
    assert ids(tiny, "hello<user>hello") == [HELLO, USER, HELLO]


def test_metadata(tiny: LoadedTokenizer, tmp_path: Path) -> None:
    assert tiny.source == tmp_path / "tiny.gguf"
    assert tiny.source_kind == "gguf"
    assert tiny.encoder == "byte_level"
    assert tiny.pre_type == "smollm"
    assert tiny.vocab_size == len(TOKENS)
    assert dict(tiny.special_tokens) == {"<|ctrl|>": CTRL, "<|eos|>": EOS}
    assert tiny.eos_token_ids == (EOS, CTRL)
    assert tiny.published_at is not None
    assert tiny.published_at.endswith("Z")


def test_absent_or_out_of_range_eos_ids_are_dropped(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", eos_id=len(TOKENS) + 7)
    assert load_tokenizer(path).eos_token_ids == ()


def test_digits_split_individually_for_smollm(tiny: LoadedTokenizer) -> None:
    assert [tiny.tokenizer.id_to_token(i) for i in ids(tiny, "2026")] == ["2", "0", "2", "6"]


def test_big_endian_gguf_loads_the_same(tmp_path: Path, tiny: LoadedTokenizer) -> None:
    path = write_gguf(tmp_path / "be.gguf", eos_id=EOS, eot_id=CTRL, endianess=GGUFEndian.BIG)
    big = load_tokenizer(path)
    assert big.eos_token_ids == tiny.eos_token_ids
    assert ids(big, "hello <user> 42") == ids(tiny, "hello <user> 42")


def test_suffix_is_not_required(tmp_path: Path) -> None:
    # A GGUF is recognised by its magic bytes too (model stores often drop the suffix).
    path = write_gguf(tmp_path / "blob-sha256-0123", eos_id=EOS)
    assert load_tokenizer(path).source_kind == "gguf"
