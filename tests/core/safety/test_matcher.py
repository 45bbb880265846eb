"""The matcher over synthetic tokens: every split, both actions, bounded holdback."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.safety.matcher import MatchOutput, PolicyMatcher
from proxy.core.safety.rules import CompiledRules
from tests.core.safety.support import compiled

Token = tuple[int, str]


def tokens_of(text: str) -> list[Token]:
    """One token per character; the ID is the code point (mod the toy vocabulary)."""
    return [(ord(c) % 1000, c) for c in text]


def run(rules: CompiledRules, batches: Sequence[Sequence[Token]]) -> tuple[MatchOutput, int]:
    """Feed the batches, then flush; the joined output and the most tokens ever held."""
    matcher = PolicyMatcher(rules)
    out = MatchOutput()
    most_held = 0
    for batch in batches:
        out = out.then(matcher.feed([t[0] for t in batch], [t[1] for t in batch]))
        most_held = max(most_held, matcher.held)
        if out.stop is not None:
            return out, most_held
    return out.then(matcher.flush()), most_held


def split(items: Sequence[Token], cuts: Sequence[int]) -> list[list[Token]]:
    bounds = sorted({0, len(items), *(min(c, len(items)) for c in cuts)})
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


TEXT = "the rain in Spain stays mainly in the plain"


@pytest.mark.parametrize("cut_a", range(len(TEXT) + 1))
def test_banned_string_split_at_every_position(cut_a: int) -> None:
    rules = compiled(stop_strings=["Spain"])
    tokens = tokens_of(TEXT)
    for cut_b in range(cut_a, len(TEXT) + 1):
        out, _ = run(rules, split(tokens, [cut_a, cut_b]))
        assert out.stop == "halt"
        assert "Spain" not in out.text
        assert TEXT.startswith(out.text)
        # Nothing at or after the offending span is ever released.
        assert len(out.text) <= TEXT.index("Spain")


@pytest.mark.parametrize("cut", range(12))
def test_banned_id_sequence_across_batches(cut: int) -> None:
    rules = compiled(stop_ids=[[5, 6, 7]])
    ids = [1, 5, 6, 2, 5, 6, 7, 9, 9, 9, 9]
    tokens = [(i, "t") for i in ids]
    for cut_b in range(cut, len(ids) + 1):
        out, _ = run(rules, split(tokens, [cut, cut_b]))
        assert out.stop == "halt"
        assert list(out.ids) == ids[: len(out.ids)]
        assert len(out.ids) <= 4  # [1, 5, 6, 2] at most: the sequence starts at index 4


def test_redact_replaces_the_span_and_continues() -> None:
    rules = compiled(redact_strings=["secret"], placeholder=[7, 7])
    out, _ = run(rules, [tokens_of("a secret here, "), tokens_of("another secr"), tokens_of("et.")])
    assert out.stop is None
    assert out.text == "a <7><7> here, another <7><7>."
    assert out.redactions == ("mask", "mask")
    # Placeholder IDs take the place of the span's IDs.
    assert out.ids.count(7) == 4
    assert ord("s") not in out.ids


def test_overlapping_redactions_merge_into_one_placeholder() -> None:
    rules = compiled(redact_strings=["abc", "cde"], placeholder=[1])
    out, _ = run(rules, [tokens_of("xabcdey")])
    assert out.text == "x<1>y"
    assert out.redactions == ("mask",)


def test_a_stop_rule_fires_even_across_a_redactable_part() -> None:
    rules = compiled(stop_strings=["xsecretx"], redact_strings=["secret"])
    out, _ = run(rules, [tokens_of("ok xsecretx no")])
    assert out.stop == "halt"
    assert out.text == "ok "


def test_redact_by_regex_waits_for_the_whole_match() -> None:
    rules = compiled(redact_regexes=[(r"\d{3}-\d{4}", 8)], placeholder="#")
    out, _ = run(rules, [tokens_of("call 555-"), tokens_of("12"), tokens_of("34 now")])
    assert out.text == "call # now"
    assert out.ids == tuple(ord(c) for c in "call # now")


def test_a_token_carrying_part_of_a_match_goes_with_it() -> None:
    rules = compiled(redact_strings=["ain"], placeholder=[0])
    # Tokens larger than characters: "Spa" + "in" + " x". The match "ain" starts inside "Spa".
    out, _ = run(rules, [[(1, "Spa"), (2, "in"), (3, " x")]])
    assert out.ids == (0, 3)
    assert out.text == "<0> x"


def test_partial_characters_stay_with_the_character_they_start() -> None:
    rules = compiled(redact_strings=["é"], placeholder=[0])
    # A two-byte character split over two tokens: the first token decodes to nothing.
    out, _ = run(rules, [[(1, "a"), (2, "")], [(3, "é"), (4, "b")]])
    assert out.ids == (1, 0, 4)


def test_nothing_is_released_after_a_stop() -> None:
    rules = compiled(stop_strings=["bad"])
    matcher = PolicyMatcher(rules)
    first = matcher.feed(*zip(*tokens_of("good bad"), strict=True))
    assert first.stop == "halt"
    assert matcher.finished
    assert matcher.feed([1], ["x"]) == MatchOutput()
    assert matcher.flush() == MatchOutput()


CLEAN_RULES = {
    "stop_strings": ["zzq", "qqqq"],
    "redact_strings": ["xyxyx"],
    "stop_ids": [[500, 501, 502]],
    "stop_regexes": [(r"\d{4,}", 12)],
}


@given(
    st.text("abcxyq 12", max_size=60),
    st.lists(st.integers(0, 60), max_size=8),
)
def test_clean_streams_pass_unchanged_with_bounded_holdback(text: str, cuts: list[int]) -> None:
    rules = compiled(**CLEAN_RULES)  # type: ignore[arg-type]
    if any(s in text for s in ("zzq", "qqqq", "xyxyx")) or any(
        text[i : i + 4].isdigit() for i in range(len(text))
    ):
        return  # not clean: covered by the tests above
    tokens = tokens_of(text)
    out, most_held = run(rules, split(tokens, cuts))
    assert out.stop is None
    assert out.text == text
    assert list(out.ids) == [t[0] for t in tokens]
    id_bound, char_bound = rules.max_holdback
    # One character per token here, so a character bound is a token bound.
    assert most_held <= max(id_bound, char_bound)
