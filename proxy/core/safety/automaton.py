"""Aho-Corasick over any hashable symbols: token IDs for banned ID sequences, characters for
banned strings.

Why this shape: the matcher must hold back only what a rule can still need. After any input,
the automaton's state *is* the longest suffix of the input that is a prefix of some pattern,
so its depth is exactly the number of trailing symbols that a later symbol could still turn
into a match: everything before them is final. One dictionary lookup per symbol (amortized),
whatever the number of patterns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Symbol = TypeVar("Symbol", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Hit:
    """A pattern occurrence that ended at the symbol just consumed."""

    pattern: int  # index into the patterns the automaton was built from
    length: int  # in symbols


class Automaton(Generic[Symbol]):
    """Immutable once built; many `Cursor`s (one per stream) can walk it."""

    __slots__ = ("_fail", "_goto", "_hit", "_hold", "longest")

    def __init__(self, patterns: Sequence[Sequence[Symbol]]) -> None:
        if any(len(p) == 0 for p in patterns):
            raise ValueError("an empty pattern matches everywhere")
        goto: list[dict[Symbol, int]] = [{}]
        depth = [0]
        own: list[int | None] = [None]
        for index, pattern in enumerate(patterns):
            state = 0
            for symbol in pattern:
                nxt = goto[state].get(symbol)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][symbol] = nxt
                    goto.append({})
                    depth.append(depth[state] + 1)
                    own.append(None)
                state = nxt
            if own[state] is None:
                own[state] = index  # the first of duplicate patterns names the match
        fail = [0] * len(goto)
        # The longest pattern that ends at each state: its own, else its fail state's.
        hit: list[Hit | None] = [None] * len(goto)
        queue: deque[int] = deque(goto[0].values())
        for state in queue:
            first = own[state]
            hit[state] = None if first is None else Hit(first, depth[state])
        while queue:
            state = queue.popleft()
            for symbol, nxt in goto[state].items():
                back = fail[state]
                while back and symbol not in goto[back]:
                    back = fail[back]
                candidate = goto[back].get(symbol, 0)
                fail[nxt] = candidate if candidate != nxt else 0
                named = own[nxt]
                hit[nxt] = Hit(named, depth[nxt]) if named is not None else hit[fail[nxt]]
                queue.append(nxt)
        # What a state must hold back: the longest suffix that more symbols could still extend
        # into a match, i.e. the nearest state on its fail chain that has transitions. A
        # completed pattern nothing extends holds nothing: it is already reported.
        hold = [0] * len(goto)
        for state in sorted(range(1, len(goto)), key=depth.__getitem__):
            hold[state] = depth[state] if goto[state] else hold[fail[state]]
        self._goto = goto
        self._fail = fail
        self._hold = hold
        self._hit = hit
        self.longest = max((len(p) for p in patterns), default=0)

    def step(self, state: int, symbol: Symbol) -> int:
        goto = self._goto
        while True:
            nxt = goto[state].get(symbol)
            if nxt is not None:
                return nxt
            if state == 0:
                return 0
            state = self._fail[state]

    def hit(self, state: int) -> Hit | None:
        return self._hit[state]

    def depth(self, state: int) -> int:
        """How many trailing symbols may still become part of a (longer) match."""
        return self._hold[state]


class Cursor(Generic[Symbol]):
    """One stream's walk over an automaton."""

    __slots__ = ("_automaton", "state")

    def __init__(self, automaton: Automaton[Symbol]) -> None:
        self._automaton = automaton
        self.state = 0

    def feed(self, symbols: Iterable[Symbol], start: int) -> list[tuple[int, Hit]]:
        """Walk `symbols`, numbered from `start`; return (end position, hit) for each match.

        The end position is exclusive: the match covers `end - hit.length` up to `end`.
        """
        automaton = self._automaton
        step = automaton.step
        hit_at = automaton.hit
        state = self.state
        hits: list[tuple[int, Hit]] = []
        position = start
        for symbol in symbols:
            state = step(state, symbol)
            position += 1
            hit = hit_at(state)
            if hit is not None:
                hits.append((position, hit))
        self.state = state
        return hits

    @property
    def pending(self) -> int:
        return self._automaton.depth(self.state)
