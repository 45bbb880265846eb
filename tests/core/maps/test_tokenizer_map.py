"""The map document: fixed key order, exact bytes, one digest over exactly those bytes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.pretok_program import compile_program
from proxy.core.maps.tokenizer_map import (
    MapContent,
    ZstdDictionary,
    digest_of_header,
    map_document,
    render_map,
)
from proxy.tokenizers.pretokenizers import LLAMA3_PATTERN

HASH = "sha256:" + "ab" * 32
CONTENT = MapContent(
    vocab_size=6,
    vocab={"a": 0, "b": 1, "ab": 2, "Ġ": 3, "<|eos|>": 5, "é": 4},
    encoder="byte_level",
    merges=("a b",),
    pre_tokenizer_pattern=LLAMA3_PATTERN,
    pre_tokenizer_program=compile_program(LLAMA3_PATTERN),
    byte_fallback=None,
    special_tokens={"<|eos|>": 5},
    published_at="2026-01-01T00:00:00Z",
    caveats=("not in the document",),
)


def test_keys_come_in_a_fixed_order_and_caveats_stay_out() -> None:
    document = map_document("test/tiny", CONTENT)
    assert list(document) == [
        "id",
        "version",
        "vocab_size",
        "encoder",
        "pre_tokenizer_pattern",
        "pre_tokenizer_program",
        "special_tokens",
        "zstd_dictionaries",
        "published_at",
        "vocab",
        "merges",
    ]
    assert document["version"] == "2"
    assert document["zstd_dictionaries"] == []
    assert "not in the document" not in json.dumps(document)


def test_optional_fields_are_left_out_not_null() -> None:
    bare = replace(CONTENT, pre_tokenizer_program=None, published_at=None, byte_fallback=(0, 255))
    document = map_document("test/tiny", bare)
    assert "pre_tokenizer_program" not in document
    assert "published_at" not in document
    assert (document["byte_fallback_start"], document["byte_fallback_end"]) == (0, 255)


def test_bytes_are_compact_utf8_with_a_newline_and_the_digest_covers_them() -> None:
    published = render_map("test/tiny", CONTENT)
    assert published.body.endswith(b"}\n")
    assert b'"\xc3\xa9":4' in published.body  # raw UTF-8, no \u escapes, no spaces
    assert b", " not in published.body
    assert b": " not in published.body
    assert published.digest == hashlib.sha256(published.body).hexdigest()
    assert published.hash == f"sha256:{published.digest}"
    assert published.header_value == f"test/tiny sha256:{published.digest}"
    assert json.loads(published.body) == map_document("test/tiny", CONTENT)


def test_a_client_reads_the_digest_from_the_header_we_write() -> None:
    published = render_map("test/tiny", CONTENT)
    assert digest_of_header(published.header_value) == published.digest
    assert digest_of_header(f"  {published.hash} ") == published.digest  # the spec's form
    for value in (
        None,
        "",
        "test/tiny",
        f"test/tiny sha256:{published.digest[:16]}",  # the proposal's short digest
        f"test/tiny sha256:{published.digest.upper()}",
        f"a b {published.hash}",
        f"test/tiny {published.digest}",
    ):
        assert digest_of_header(value) is None, value


def test_same_content_same_bytes_and_any_change_changes_the_digest() -> None:
    first = render_map("test/tiny", CONTENT)
    assert render_map("test/tiny", replace(CONTENT)) == first
    assert render_map("test/other", CONTENT).digest != first.digest
    later = replace(CONTENT, published_at="2026-01-02T00:00:00Z")
    assert render_map("test/tiny", later).digest != first.digest


def test_dictionaries_are_listed_in_the_order_given() -> None:
    dictionaries = [
        ZstdDictionary(
            "msgpack", "https://example.test/m.dict", HASH, 16384, "2026-01-01T00:00:00Z"
        ),
        ZstdDictionary("protobuf", "https://example.test/p.dict", HASH, 8192, corpus_summary="c"),
    ]
    document = map_document("test/tiny", CONTENT, dictionaries)
    assert document["zstd_dictionaries"] == [
        {
            "format": "msgpack",
            "url": "https://example.test/m.dict",
            "hash": HASH,
            "size_bytes": 16384,
            "trained_at": "2026-01-01T00:00:00Z",
        },
        {
            "format": "protobuf",
            "url": "https://example.test/p.dict",
            "hash": HASH,
            "size_bytes": 8192,
            "corpus_summary": "c",
        },
    ]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"format": "json"}, "format"),
        ({"hash": "sha256:" + "AB" * 32}, "lowercase"),
        ({"hash": "ab" * 32}, "sha256:"),
        ({"size_bytes": 0}, "size"),
    ],
)
def test_bad_dictionary_records_are_refused(fields: dict[str, object], problem: str) -> None:
    values: dict[str, object] = {"format": "msgpack", "url": "u", "hash": HASH, "size_bytes": 1}
    with pytest.raises(TokenizerMapError, match=problem):
        ZstdDictionary(**{**values, **fields})  # type: ignore[arg-type]


def test_an_unpublishable_id_is_refused() -> None:
    with pytest.raises(TokenizerMapError, match="map id"):
        render_map("Test/../x", CONTENT)


def test_a_lone_surrogate_is_one_clear_error() -> None:
    broken = replace(CONTENT, vocab={**CONTENT.vocab, "\ud800": 6}, vocab_size=7)
    with pytest.raises(TokenizerMapError, match="cannot be written as JSON"):
        render_map("test/tiny", broken)
