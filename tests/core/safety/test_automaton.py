"""Aho-Corasick: every occurrence found, and the pending depth is the minimal holdback."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.safety.automaton import Automaton, Cursor


def occurrences(patterns: list[str], text: str) -> set[tuple[int, int]]:
    """(end, pattern) for every occurrence of every pattern, by brute force."""
    return {
        (i + len(p), k)
        for k, p in enumerate(patterns)
        for i in range(len(text) - len(p) + 1)
        if text[i : i + len(p)] == p
    }


@given(
    st.lists(st.text("abc", min_size=1, max_size=5), min_size=1, max_size=6, unique=True),
    st.text("abcd", max_size=40),
    st.lists(st.integers(0, 40), max_size=5),
)
def test_hits_and_pending_match_brute_force(
    patterns: list[str], text: str, cuts: list[int]
) -> None:
    automaton: Automaton[str] = Automaton(patterns)
    cursor = Cursor(automaton)
    hits = []
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        hits += cursor.feed(text[start:end], start)
        # The pending depth is the longest suffix that is a proper prefix of some pattern.
        prefixes = {p[:i] for p in patterns for i in range(1, len(p))}
        longest = max((k for k in range(1, end + 1) if text[end - k : end] in prefixes), default=0)
        assert cursor.pending == longest
    # Each reported hit is the longest pattern ending there; every end is reported.
    found = {(end, hit.pattern) for end, hit in hits}
    expected_ends = {end for end, _ in occurrences(patterns, text)}
    assert {end for end, _ in found} == expected_ends
    for end, k in found:
        candidates = [p for p in patterns if text[:end].endswith(p)]
        assert len(patterns[k]) == max(map(len, candidates))


def test_token_id_sequences() -> None:
    automaton: Automaton[int] = Automaton([(7, 8, 9), (8,)])
    cursor = Cursor(automaton)
    assert cursor.feed([1, 7], 0) == []
    assert cursor.pending == 1
    hits = cursor.feed([8, 9], 2)
    assert [(end, hit.pattern, hit.length) for end, hit in hits] == [(3, 1, 1), (4, 0, 3)]
    assert cursor.pending == 0
