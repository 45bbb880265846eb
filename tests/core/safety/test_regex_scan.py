"""The incremental regex scan finds what a search of the final text finds, holding little."""

from __future__ import annotations

import itertools

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.safety.regex_scan import RegexScanner
from proxy.core.safety.rules import RegexRule

PATTERNS = [
    r"ab+c",
    r"abc|a",
    r"a(?:bc)?",
    r"\bcab\b",
    r"b{2,}",
    r"(?<=c)ab",
    r"ba(?=c)",
    r"c\d*a",
]


def reference(pattern: regex.Pattern[str], text: str) -> list[tuple[int, int]]:
    """Non-overlapping, non-empty matches of the whole text, left to right."""
    found, pos = [], 0
    while (match := pattern.search(text, pos)) is not None:
        if match.end() == match.start():
            pos = match.start() + 1
            continue
        found.append(match.span())
        pos = match.end()
    return found


def scan(rule: RegexRule, deltas: list[str]) -> tuple[list[tuple[int, int]], list[int]]:
    """Feed deltas as the matcher does (the text from the oldest held position on)."""
    scanner = RegexScanner(rule)
    text, base, found, holds = "", 0, [], []
    for delta in deltas:
        text += delta
        matches, hold = scanner.scan(text, base, final=False)
        found += matches
        holds.append(base + len(text) - hold)
        # Release everything before the hold, keeping max_length characters of context.
        keep_from = max(0, hold - base - rule.max_length)
        text, base = text[keep_from:], base + keep_from
    matches, _ = scanner.scan(text, base, final=True)
    return found + matches, holds


@given(
    st.sampled_from(PATTERNS),
    st.text("abc1 ", max_size=30),
    st.lists(st.integers(0, 30), max_size=6),
)
def test_equals_a_search_of_the_final_text(pattern: str, text: str, cuts: list[int]) -> None:
    rule = RegexRule(regex.compile(pattern), max_length=100, category="c")
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    found, holds = scan(rule, deltas)
    assert found == reference(rule.pattern, text)
    assert all(0 <= held < rule.max_length for held in holds)


def test_holds_only_while_a_match_can_still_start() -> None:
    rule = RegexRule(regex.compile(r"\d{3}-\d{4}"), max_length=8, category="c")
    scanner = RegexScanner(rule)
    matches, hold = scanner.scan("call me", 0, final=False)
    assert (matches, hold) == ([], 7)  # nothing can start a match: nothing held
    matches, hold = scanner.scan("call me 555-1", 0, final=False)
    assert (matches, hold) == ([], 8)  # "555-1" may become a number
    matches, hold = scanner.scan("call me 555-1234 now", 0, final=False)
    assert (matches, hold) == ([(8, 16)], 20)


def test_a_match_that_may_still_grow_waits_then_acts_at_the_bound() -> None:
    rule = RegexRule(regex.compile(r"x\d+"), max_length=5, category="c")
    scanner = RegexScanner(rule)
    assert scanner.scan("ax12", 0, final=False) == ([], 1)  # "x12" may grow
    # Five characters from its start the bound is reached: act on the match as it stands.
    assert scanner.scan("ax12345", 0, final=False) == ([(1, 7)], 7)


@pytest.mark.parametrize("final", [False, True])
def test_a_partial_match_longer_than_the_bound_is_abandoned(final: bool) -> None:
    rule = RegexRule(regex.compile(r"<[a-z]*>"), max_length=4, category="c")
    scanner = RegexScanner(rule)
    matches, hold = scanner.scan("<abcdef", 0, final=final)
    assert matches == []
    assert hold == 7
