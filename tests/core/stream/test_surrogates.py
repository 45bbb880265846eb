"""UTF-16 surrogate pairs cut between events (proxy/core/stream/surrogates.py): every split point,
any split (hypothesis), and the lone surrogates nothing can rejoin."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.surrogates import SurrogatePairs, rejoined


def utf16_units(text: str) -> str:
    """`text` as a JSON parser reads it when each UTF-16 code unit came as its own escape: one
    Python character per unit, surrogate halves apart."""
    raw = text.encode("utf-16-le")
    return "".join(chr(int.from_bytes(raw[i : i + 2], "little")) for i in range(0, len(raw), 2))


def through(pieces: list[str]) -> str:
    pairs = SurrogatePairs()
    out = "".join(pairs.feed(piece) for piece in pieces)
    pairs.flush()
    return out


TEXT = "Hello 🎉 world 𝄞𝄞, 日本 👨\u200d👩\u200d👧!"


def test_every_split_point_rejoins_the_text() -> None:
    units = utf16_units(TEXT)
    assert len(units) > len(TEXT)  # there are pairs to cut
    for cut in range(len(units) + 1):
        assert through([units[:cut], units[cut:]]) == TEXT, cut
        for second in range(cut, len(units) + 1, 3):
            assert through([units[:cut], units[cut:second], units[second:]]) == TEXT


astral = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF)
texts = st.lists(st.one_of(astral, st.characters(codec="utf-8")), max_size=40).map("".join)


@given(text=texts, cuts=st.lists(st.integers(0, 80)))
def test_any_split_in_code_units_rejoins_the_text(text: str, cuts: list[int]) -> None:
    units = utf16_units(text)
    bounds = sorted({0, len(units), *(min(cut, len(units)) for cut in cuts)})
    pieces = [units[a:b] for a, b in itertools.pairwise(bounds)]
    assert through(pieces) == text


def test_text_without_surrogates_is_the_same_object() -> None:
    pairs = SurrogatePairs()
    for text in ("plain", "日本 🎉", ""):
        assert pairs.feed(text) is text


def test_a_held_half_survives_events_without_text() -> None:
    pairs = SurrogatePairs()
    assert pairs.feed("a\ud83c") == "a"
    assert pairs.feed("") == ""  # a role-only delta, a usage chunk
    assert pairs.feed("\udf89b") == "🎉b"


@pytest.mark.parametrize(
    "pieces",
    [
        ["\udf89 world"],  # a low half first
        ["a\ud83cb"],  # a high half inside a text
        ["a\ud83c", "b"],  # ... or before text that does not start with the low half
        ["a\ud83c\ud83c", "\udf89"],  # two high halves: only the second can be rejoined
        ["\udf89\ud83c", "\udf89"],
    ],
)
def test_lone_surrogates_are_protocol_errors(pieces: list[str]) -> None:
    with pytest.raises(UpstreamProtocolError, match="lone UTF-16 surrogate") as caught:
        through(pieces)
    assert caught.value.code == "bad_upstream_chunk"


def test_a_high_half_at_the_end_has_no_other_half() -> None:
    pairs = SurrogatePairs()
    assert pairs.feed("Hello \ud83c") == "Hello "
    with pytest.raises(UpstreamProtocolError, match="first half"):
        pairs.flush()
    pairs.flush()  # said once


def test_rejoined_joins_pairs_inside_one_text() -> None:
    assert rejoined("x\ud83c\udf89y") == "x🎉y"
    with pytest.raises(UpstreamProtocolError, match="U\\+DF89, at character 1"):
        rejoined("x\udf89")
