"""IDs to text as the backend renders them, at any split into frames; text cut at stop strings."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.render import text as text_module
from proxy.core.render.text import StopText, TextDecoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.conftest import UPSTREAM_FIXTURES
from tests.core.verify.conftest import Families, MapFamily

FFFD = "\ufffd"


def byte_ids(decoder: MapDecoder) -> dict[int, int]:
    """The one-byte tokens of a byte-level map (SmolLM2 has one for every byte UTF-8 uses)."""
    found: dict[int, int] = {}
    for token_id, piece in enumerate(decoder.table):
        if piece is not None and len(piece) == 1:
            found.setdefault(piece[0], token_id)
    assert all(byte in found for byte in "👌日本é".encode())
    return found


def render(decoder: MapDecoder, frames: list[list[int]]) -> list[str]:
    text = TextDecoder(decoder)
    return [text.feed(ids) for ids in frames] + [text.flush()]


def whole(decoder: MapDecoder, ids: list[int]) -> str:
    """The one-shot reading: every ID's bytes joined, decoded once."""
    pieces = [decoder.piece(token_id) for token_id in ids]
    return b"".join(FFFD.encode() if p is None else p for p in pieces).decode("utf-8", "replace")


def splits(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({min(cut, len(ids)) for cut in cuts})
    edges = [0, *points, len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(edges)]


@st.composite
def id_streams(draw: st.DrawFn, decoder: MapDecoder) -> tuple[list[int], list[list[int]]]:
    special = sorted(decoder.special)
    one_id = (
        st.integers(0, decoder.size - 1)
        | st.sampled_from(sorted(byte_ids(decoder).values()))  # bytes of split characters
        | st.sampled_from(special)
        | st.integers(decoder.size, decoder.size + 10)  # unknown to the map
    )
    ids = draw(st.lists(one_id, max_size=40))
    cuts = draw(st.lists(st.integers(0, 40), max_size=12))
    return ids, splits(ids, cuts)


@given(data=st.data())
def test_any_split_into_frames_renders_the_whole_stream(
    smollm2_map: MapDecoder, data: st.DataObject
) -> None:
    ids, frames = data.draw(id_streams(smollm2_map))
    assert "".join(render(smollm2_map, frames)) == whole(smollm2_map, ids)


@given(ids=st.lists(st.integers(0, 49151), max_size=30), cuts=st.lists(st.integers(0, 30)))
def test_ids_render_as_the_tokenizer_decodes_them(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, ids: list[int], cuts: list[int]
) -> None:
    # An independent reading: Hugging Face's own decoder over the tokenizer the map came from.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(render(smollm2_map, splits(ids, cuts))) == expected


def test_a_character_waits_for_its_last_byte(smollm2_map: MapDecoder) -> None:
    by_byte = byte_ids(smollm2_map)
    emoji = [by_byte[b] for b in "👌".encode()]
    assert render(smollm2_map, [[i] for i in emoji]) == ["", "", "", "👌", ""]
    # Every split point of a text whose characters span IDs.
    text = "a👌日本é z"
    ids = [by_byte[b] for b in text.encode()]
    for cut in range(len(ids) + 1):
        pieces = render(smollm2_map, [ids[:cut], ids[cut:]])
        assert "".join(pieces) == text
        assert text.startswith(pieces[0])
        assert pieces[0].encode() == bytes(text.encode()[:cut]).decode("utf-8", "ignore").encode()


@given(data=st.data(), slice_ids=st.integers(1, 8))
def test_a_frame_of_many_ids_renders_as_the_same_ids_whole(
    smollm2_map: MapDecoder, data: st.DataObject, slice_ids: int
) -> None:
    # A frame longer than a slice is joined a slice at a time; slices a few IDs long put a
    # boundary inside characters, special tokens and unknown IDs alike.
    ids, _ = data.draw(id_streams(smollm2_map))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_module, "_SLICE", slice_ids)
        assert "".join(render(smollm2_map, [ids])) == whole(smollm2_map, ids)


def test_a_character_cut_at_the_end_is_one_replacement(smollm2_map: MapDecoder) -> None:
    by_byte = byte_ids(smollm2_map)
    first_two = [by_byte[b] for b in "日".encode()[:2]]
    assert render(smollm2_map, [[by_byte[ord("x")], *first_two]]) == ["x", FFFD]


def test_special_tokens_render_as_nothing_even_inside_a_character(
    smollm2_map: MapDecoder,
) -> None:
    by_byte = byte_ids(smollm2_map)
    end_of_turn = min(smollm2_map.special)
    a, b, c = ("本".encode()[i] for i in range(3))
    assert render(smollm2_map, [[by_byte[a], end_of_turn], [by_byte[b], by_byte[c]]]) == [
        "",
        "本",
        "",
    ]
    assert render(smollm2_map, [[end_of_turn]]) == ["", ""]


def test_an_unknown_id_is_a_replacement_and_breaks_a_character(smollm2_map: MapDecoder) -> None:
    by_byte = byte_ids(smollm2_map)
    unknown = smollm2_map.size + 5
    a, b, c = "本".encode()
    frames = [[by_byte[a], by_byte[b]], [unknown], [by_byte[c], by_byte[ord("x")]]]
    assert "".join(render(smollm2_map, frames)) == FFFD * 3 + "x"


def test_the_models_sampled_ids_render_as_its_non_streamed_answer(
    smollm2_map: MapDecoder,
) -> None:
    # llama.cpp's native /completion with every sampled id (tests/fixtures/upstream/README.md),
    # "、ア�" included: the last id is the first byte of a character max_tokens cut. Where the
    # request had stop strings, the ids hold the one that matched and the answer does not.
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())
    assert any("stop" in answer["request"] for answer in truth.values())
    for name, answer in truth.items():
        tokens = answer["tokens"]
        for size in (1, 2, 5):
            frames = [tokens[i : i + size] for i in range(0, len(tokens), size)]
            stop = StopText(answer["request"].get("stop", ()))
            text = "".join(stop.feed(piece) for piece in render(smollm2_map, frames))
            assert text + stop.flush() == answer["content"], name


@pytest.mark.parametrize("name", ["mistral.json", "qwen3.json"])
def test_other_families_render_as_their_tokenizer(
    families: Families, name: str, smollm2_vocabulary: Vocabulary
) -> None:
    family: MapFamily = families.map(name)
    text = "Hello 👋 world, 日本語 and\n  spaces\t😀!"
    ids = family.encode(text)
    rendered = "".join(render(family.decoder, [[i] for i in ids]))
    # SentencePiece's decode drops the space it prepends to a text; streamed text keeps every
    # space a token carries (docs/CLIENTS.md), so compare past it.
    decoded = family.loaded.tokenizer.decode(ids, skip_special_tokens=True)
    assert rendered.lstrip(" ") == decoded.lstrip(" ") == text


@pytest.fixture(scope="module")
def families(smollm2_vocabulary: Vocabulary) -> Families:
    return Families(smollm2_vocabulary)


# --- stop strings ---------------------------------------------------------------------------


def cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    found = [text.find(stop) for stop in stops if stop and stop in text]
    return (text[: min(found)], True) if found else (text, False)


@given(
    text=st.text(alphabet="ab \n", max_size=30),
    stops=st.lists(st.text(alphabet="ab \n", max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=10),
)
def test_any_split_cuts_at_the_first_stop_string(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    stop = StopText(stops)
    points = sorted({min(cut, len(text)) for cut in cuts})
    edges = [0, *points, len(text)]
    out = "".join(stop.feed(text[a:b]) for a, b in itertools.pairwise(edges))
    out += stop.flush()
    assert (out, stop.matched) == cut_at_stops(text, stops)


def test_the_possible_start_of_a_stop_string_is_held_back() -> None:
    stop = StopText([" Paris!", "\n\n"])
    assert stop.feed("It is Par") == "It is"
    assert stop.feed("is") == ""  # " Paris" may still become " Paris!"
    assert stop.feed(".\n") == " Paris."
    assert stop.flush() == "\n"
    assert not stop.matched
    stop = StopText([" Paris!"])
    assert stop.feed("It is Paris") == "It is"
    assert stop.feed("! Then more") == ""
    assert stop.matched
    assert stop.feed("text") == stop.flush() == ""


def test_no_stop_strings_hold_nothing_back() -> None:
    stop = StopText(["", ""])
    assert stop.feed("abc") == "abc"
    assert stop.flush() == ""
