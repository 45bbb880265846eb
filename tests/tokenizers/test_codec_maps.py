"""Maps of real tokenizers: golden encode vectors, golden map bytes, schema-valid documents, and
round trips: map -> tokenizer -> the same ids, and the same map bytes again.

The golden file (tests/fixtures/tokenizers/golden.json) pins, per family, the ids of a dozen
texts and the sha256 of the map generated with a fixed id and `published_at`.
"""

from __future__ import annotations

import os
import shutil
import unicodedata
from pathlib import Path

import codecai
import pytest

from proxy.core.maps.checks import map_problems
from proxy.core.maps.content import map_content
from proxy.core.maps.tokenizer_map import render_map
from proxy.maps.publish import publish
from proxy.maps.schema import schema_problems
from proxy.tokenizers import LoadedTokenizer, TokenizerLoadError, load_tokenizer
from proxy.tokenizers.probes import PROBE_STRINGS
from tests.tokenizers.support import MAP_FAMILIES, MapCache, TinyVocab, family_path, write_gguf

# Qwen3's tokenizer.json normalizes to NFC; a map has no normalizer (docs/TOKENIZER_MAPS.md).
NFC_FAMILIES = frozenset({"qwen3.json"})


def encode(loaded: LoadedTokenizer, text: str) -> list[int]:
    ids: list[int] = loaded.tokenizer.encode(text, add_special_tokens=False).ids
    return ids


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_golden_encode_vectors(family: str, family_maps: MapCache) -> None:
    golden = family_maps.golden
    loaded = family_maps(family).loaded
    expected = golden["families"][family]["ids"]
    assert [encode(loaded, text) for text in golden["texts"]] == expected


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_map_bytes_are_golden(family: str, family_maps: MapCache) -> None:
    golden = family_maps.golden["families"][family]
    published = family_maps(family).published
    assert (published.digest, len(published.body)) == (golden["map_sha256"], golden["map_bytes"])


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_map_is_schema_valid_and_consistent(family: str, family_maps: MapCache) -> None:
    import orjson

    document = orjson.loads(family_maps(family).published.body)
    assert schema_problems(document) == []
    assert map_problems(document) == []
    assert document["vocab_size"] == family_maps(family).loaded.vocab_size
    assert len(document["vocab"]) == document["vocab_size"]


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_map_round_trip_golden(family: str, family_maps: MapCache) -> None:
    golden = family_maps.golden
    reloaded = family_maps(family).reloaded
    assert reloaded.source_kind == "codec-map"
    assert reloaded.map_id == golden["families"][family]["map_id"]
    assert [encode(reloaded, text) for text in golden["texts"]] == golden["families"][family]["ids"]


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_map_round_trip_every_probe(family: str, family_maps: MapCache) -> None:
    maps = family_maps(family)
    nfc = family in NFC_FAMILIES
    differ = [
        text
        for text in PROBE_STRINGS
        if encode(maps.loaded, text)
        != encode(maps.reloaded, unicodedata.normalize("NFC", text) if nfc else text)
    ]
    assert differ == []


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_regenerated_map_is_byte_identical(family: str, family_maps: MapCache) -> None:
    maps = family_maps(family)
    again = map_content(
        maps.reloaded.tokenizer,
        encoder=maps.reloaded.encoder,
        vocab_size=maps.reloaded.vocab_size,
        special_tokens=maps.reloaded.special_tokens,
        published_at=maps.reloaded.published_at,
    )
    assert render_map(maps.published.id, again).body == maps.published.body


def test_what_each_family_map_says(family_maps: MapCache) -> None:
    smollm2, llama3, qwen3, mistral = (family_maps(f).content for f in MAP_FAMILIES)
    # Digits-then-GPT-2 and metaspace do not fit op set v1; Llama-3 and Qwen do.
    assert smollm2.pre_tokenizer_program is None
    assert smollm2.pre_tokenizer_pattern is not None
    assert smollm2.pre_tokenizer_pattern.startswith(r"\p{N}|")
    assert llama3.pre_tokenizer_program is not None
    assert qwen3.pre_tokenizer_program is not None
    assert (mistral.pre_tokenizer_pattern, mistral.pre_tokenizer_program) == (None, None)
    assert mistral.encoder == "metaspace"
    assert mistral.byte_fallback == (3, 258)
    assert smollm2.byte_fallback is None
    assert qwen3.caveats
    assert "NFC" in qwen3.caveats[0]
    assert smollm2.caveats == llama3.caveats == mistral.caveats == ()
    # Non-special added tokens are in the vocab, control tokens also in special_tokens.
    assert qwen3.vocab["<think>"] == 151667
    assert "<think>" not in qwen3.special_tokens
    assert qwen3.special_tokens["<|im_end|>"] == 151645


@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_codecai_reads_the_map_and_renders_the_golden_ids(
    family: str, family_maps: MapCache
) -> None:
    golden = family_maps.golden
    tokenizer_map = codecai.TokenizerMap.from_json(family_maps(family).published.body)
    assert tokenizer_map.vocab_size == family_maps(family).loaded.vocab_size
    # SentencePiece renders the "▁" it prepended to the text as a leading space.
    prefix = " " if family == "mistral.json" else ""
    for text, ids in zip(golden["texts"], golden["families"][family]["ids"], strict=True):
        assert codecai.detokenize(tokenizer_map, ids) == prefix + text


def test_published_at_is_the_source_file_time_not_the_clock(
    tmp_path: Path, family_maps: MapCache
) -> None:
    source = tmp_path / "tokenizer.json"
    shutil.copyfile(family_path("mistral.json"), source)
    os.utime(source, (1_700_000_000, 1_700_000_000))
    loaded = load_tokenizer(source)
    assert loaded.published_at == "2023-11-14T22:13:20Z"
    content = map_content(
        loaded.tokenizer,
        encoder=loaded.encoder,
        vocab_size=loaded.vocab_size,
        special_tokens=loaded.special_tokens,
        published_at=loaded.published_at,
    )
    first = render_map("mistralai/mistral-7b", content)
    assert render_map("mistralai/mistral-7b", content).body == first.body
    assert b'"published_at":"2023-11-14T22:13:20Z"' in first.body
    # A map keeps the time it states, whatever its own file's mtime.
    map_file = tmp_path / "mistral.map.json"
    map_file.write_bytes(first.body)
    assert load_tokenizer(map_file).published_at == "2023-11-14T22:13:20Z"


def load_error(path: Path) -> str:
    with pytest.raises(TokenizerLoadError) as caught:
        load_tokenizer(path)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


def test_a_schema_violation_is_one_line(tmp_path: Path, family_maps: MapCache) -> None:
    import orjson

    document = orjson.loads(family_maps("mistral.json").published.body)
    document["encoder"] = "sentencepiece"
    document["extra"] = True
    path = tmp_path / "map.json"
    path.write_bytes(orjson.dumps(document))
    assert load_error(path) == (
        f'{path}: not a valid Codec tokenizer map: $.encoder: "sentencepiece" is not one of '
        '"byte_level" or "metaspace" (and 1 more)'
    )


def test_an_inconsistent_map_is_one_line(tmp_path: Path, family_maps: MapCache) -> None:
    import orjson

    document = orjson.loads(family_maps("smollm2").published.body)
    document["merges"].append("Ġ zzzz")
    path = tmp_path / "map.json"
    path.write_bytes(orjson.dumps(document))
    assert load_error(path).endswith("merge 'Ġ zzzz' needs 'zzzz', which is not in vocab")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"id": "x", "version": "1", "vocab_size": 2, "tokens": {"0": "a"}}, "v1 map"),
        ({"id": "x", "version": "2", "vocab_size": 2, "vocab": {"a": 0}}, "identity map"),
        (
            {"id": "x", "version": "2", "vocab_size": 2, "vocab": {"a": 0}, "encoder": "metaspace"},
            "identity map",
        ),
    ],
)
def test_maps_that_cannot_tokenize_are_refused(
    tmp_path: Path, document: dict[str, object], problem: str
) -> None:
    import orjson

    path = tmp_path / "map.json"
    path.write_bytes(orjson.dumps(document))
    assert problem in load_error(path)


def test_added_tokens_round_trip_through_a_map(tmp_path: Path) -> None:
    # GGUF USER_DEFINED tokens are matched whole in text; so must the map's tokenizer match
    # them, a one-character one (not a byte symbol) included, and CONTROL tokens never.
    vocab = TinyVocab(user_defined=("<user>", "\u2603"))
    source = load_tokenizer(write_gguf(tmp_path / "tiny.gguf", vocab=vocab))
    path = tmp_path / "tiny.map.json"
    path.write_bytes(publish(source, "test/tiny").body)
    reloaded = load_tokenizer(path)
    for text in ["hello<user>\u2603 hello", "<|ctrl|> hello", "he\u2603ll<user", ""]:
        assert encode(reloaded, text) == encode(source, text), text
    assert encode(source, "\u2603") == [vocab.all_tokens().index("\u2603")]
