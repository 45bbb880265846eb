"""The map decoder renders every ID as codecai's `Detokenizer` does, from the published bytes.

Checked for every tokenizer file the tests fetch: each single ID, and the IDs of
hypothesis-generated texts, joined. Then the map shapes the proxy does not publish but a map may
have (a v1 `tokens` table, no encoder, a byte-fallback range in a byte-level map), and maps that
are not maps.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from codecai import Detokenizer, TokenizerMap
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import TokenizerMapError
from proxy.core.verify.map_decoder import MapDecoder
from tests.core.verify.conftest import MAP_FAMILIES, Families, MapFamily


@pytest.fixture(params=MAP_FAMILIES, scope="module")
def family(request: pytest.FixtureRequest, families: Families) -> MapFamily:
    name: str = request.param
    return families.map(name)


def joined(decoder: MapDecoder, ids: list[int]) -> bytes:
    pieces = [decoder.piece(token_id) for token_id in ids]
    assert None not in pieces
    return b"".join(piece for piece in pieces if piece is not None)


def test_every_single_id_renders_as_codecai_renders_it(
    family: MapFamily, families: Families
) -> None:
    decoder = family.decoder
    detokenizer = families.detokenizer(family.name)
    for token_id in range(decoder.size + 2):
        want = detokenizer.render([token_id])
        piece = decoder.piece(token_id)
        if piece is None:
            assert want == "\ufffd", token_id  # codecai's rendering of an ID it does not know
        else:
            assert piece.decode("utf-8", "replace") == want, token_id
        detokenizer.reset()


def test_special_tokens_render_as_nothing_and_unknown_ids_as_nothing_to_match(
    family: MapFamily,
) -> None:
    document = orjson.loads(family.body)
    decoder = family.decoder
    special = set(document["special_tokens"].values())
    fallback = range(
        document.get("byte_fallback_start", 0), document.get("byte_fallback_end", -1) + 1
    )
    assert special - set(fallback) == decoder.special
    assert all(decoder.piece(token_id) == b"" for token_id in decoder.special)
    for token_id in (-1, decoder.size, decoder.size + 1000, 1 << 32):
        assert decoder.piece(token_id) is None
    assert decoder.map_id == f"test/{family.name}"
    assert decoder.dummy_prefix == (document["encoder"] == "metaspace")


# Assigned, printable characters plus the fragments that split into several tokens or none.
FRAGMENTS = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "'s",
    "世界",
    "こんにちは。",
    "🎉",
    "👨\u200d👩\u200d👧",
    "é",
    "e\u0301",
    "<|im_end|>",
    "<think>",
    "▁",
    "Ġ",
    "\u00a0",
    "1234",
]
characters = st.characters(exclude_categories=("Cs", "Co", "Cn", "Cc"))
texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(characters, max_size=4)), max_size=24
).map("".join)


@given(text=texts)
def test_the_ids_of_a_text_render_as_codecai_renders_them(
    family: MapFamily, families: Families, text: str
) -> None:
    ids = family.encode(text)
    detokenizer = families.detokenizer(family.name)
    want = detokenizer.render(ids)
    detokenizer.reset()
    assert joined(family.decoder, ids).decode() == want


# --- map shapes -------------------------------------------------------------------------------


def tiny(**fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"id": "test/tiny", "version": "2", "vocab_size": 8}
    document.update(fields)
    return document


def both(document: dict[str, Any], ids: list[int]) -> tuple[str, str]:
    """(our rendering, codecai's) of `ids` under `document`."""
    decoder = MapDecoder.from_map(json.dumps(document).encode())
    pieces = [decoder.piece(token_id) for token_id in ids]
    ours = "".join(
        "\ufffd" if piece is None else piece.decode("utf-8", "replace") for piece in pieces
    )
    return ours, Detokenizer(TokenizerMap.from_json(document)).render(ids)


def test_metaspace_spaces_and_byte_fallback() -> None:
    vocab = {"<unk>": 0, "▁Hi": 1, "▁▁": 2, "<0x41>": 3 + 0x41, "<0x0A>": 9, "</s>": 259}
    document = tiny(
        encoder="metaspace",
        vocab=vocab,
        byte_fallback_start=3,
        byte_fallback_end=258,
        special_tokens={"</s>": 259},
    )
    decoder = MapDecoder.from_map(json.dumps(document).encode())
    assert [decoder.piece(i) for i in (1, 2, 68, 13, 259)] == [b" Hi", b"  ", b"A", b"\n", b""]
    # A `<0xNN>` entry is a byte only through the range: outside it, it is no text at all.
    assert decoder.piece(9) == bytes([9 - 3])
    assert decoder.piece(260) is None
    ours, theirs = both(document, [1, 2, 68, 259, 13])
    assert ours == theirs == " Hi  A\n"


def test_a_v1_tokens_table_and_a_map_without_encoder() -> None:
    document = tiny(vocab={"a▁b": 0, "c": 1}, tokens={"1": "see", "4": "four", "x": "no"})
    decoder = MapDecoder.from_map(json.dumps(document).encode())
    assert [decoder.piece(i) for i in range(5)] == [b"a\xe2\x96\x81b", b"see", None, None, b"four"]
    assert both(document, [0, 1, 4]) == ("a▁bseefour",) * 2


def test_byte_level_added_token_text_and_the_fallback_range_winning() -> None:
    # Characters outside GPT-2's alphabet stand for their own UTF-8 (an added token's text);
    # an ID in the fallback range is its byte even if it is also special.
    document = tiny(
        encoder="byte_level",
        vocab={"Ġhi": 0, "<tool call>": 1, "Ã©": 2, "é": 3},
        special_tokens={"<eos>": 5, "<x>": 6},
        byte_fallback_start=6,
        byte_fallback_end=6 + 255,
    )
    decoder = MapDecoder.from_map(json.dumps(document).encode())
    assert [decoder.piece(i) for i in range(4)] == [b" hi", b"<tool call>", "é".encode(), b"\xe9"]
    assert decoder.special == {5}
    assert decoder.piece(6) == b"\x00"
    assert both(document, [0, 1, 2, 5, 4]) == (" hi<tool call>é\ufffd",) * 2


@pytest.mark.parametrize("encoder", ["metaspace", "byte_level"])
def test_a_lone_surrogate_is_text_nothing_matches(encoder: str) -> None:
    # orjson refuses such JSON (TokenizerMapError); a parsed document may still hold one.
    decoder = MapDecoder.from_document({"encoder": encoder, "vocab": {"a\ud800": 0, "b": 1}})
    assert [decoder.piece(0), decoder.piece(1)] == [None, b"b"]
    with pytest.raises(TokenizerMapError, match="not JSON"):
        MapDecoder.from_map(b'{"vocab": {"\\ud800": 0}}')


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"encoder": "wordpiece", "vocab": {}}', "encoder"),
        (b'{"vocab": {"a": -1}}', "vocab"),
        (b'{"vocab": ["a"]}', "vocab"),
        (b'{"vocab": {"a": 0}, "special_tokens": {"x": "1"}}', "special_tokens"),
        (b'{"vocab": {"a": 0}, "byte_fallback_start": 3}', "byte_fallback"),
        (b'{"vocab": {"a": 0}, "byte_fallback_start": 3, "byte_fallback_end": 300}', "256"),
        (b'{"vocab": {"a": 0}, "vocab_size": 0}', "vocab_size"),
        (b'{"vocab": {"a": 0}, "vocab_size": "8"}', "vocab_size"),
    ],
)
def test_what_is_not_a_map_is_refused(body: bytes, problem: str) -> None:
    with pytest.raises(TokenizerMapError, match=problem):
        MapDecoder.from_map(body)


def test_the_vocabulary_size_a_map_states() -> None:
    # codec-spec.md §7: valid IDs are 0 .. vocab_size - 1; a map may list fewer (padding).
    decoder = MapDecoder.from_map(json.dumps(tiny(vocab={"a": 0, "b": 1})).encode())
    assert (decoder.size, decoder.vocab_size) == (2, 8)
    # Without one, one past the highest ID listed; below one it lists, that ID still counts.
    unsized = {"id": "test/unsized", "vocab": {"a": 0, "b": 1}}
    assert MapDecoder.from_map(json.dumps(unsized).encode()).vocab_size == 2
    assert MapDecoder.from_map(json.dumps(tiny(vocab={"a": 20})).encode()).vocab_size == 21


def test_a_map_is_named_by_its_id_and_digest() -> None:
    document = tiny(vocab={"a": 0})
    assert MapDecoder.from_document(document).name == "test/tiny"
    named = MapDecoder.from_document(document, digest="ab" * 32)
    assert named.name == f"test/tiny sha256:{'ab' * 32}"
