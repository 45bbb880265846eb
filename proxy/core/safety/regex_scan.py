"""One regex rule scanned over a stream's growing text, holding back as little as it can.

The bound (documented in docs/VERSIONING_AND_SAFETY.md): every rule has a `max_length` in
characters. Any match of at most that length is found, whatever the deltas; a regex never holds
back more than `max_length - 1` characters, and holds back nothing unless a match could still
start in the text it holds.

How: the `regex` module's partial matching says whether the text from a position could still
become a match once more text arrives. After each delta the scanner searches from where it left
off. At the leftmost candidate start `s`:

* no candidate at all: nothing in the new text can begin a match, so nothing is held;
* only a partial match (no full one yet) at `s`: hold from `s`, unless `s` is already
  `max_length` characters back, in which case no bounded match starts there and the search
  moves on to `s + 1`;
* a full match `[s, e)` that more text could still change (it touches the end of the text, or a
  longer match from `s` is still possible, e.g. `abc|a` on "…ab"): hold from `s` while within the
  bound, else act on `[s, e)` as found;
* a full match that no later text can change: report it and continue from `e`.

Found matches are therefore exactly those a search of the whole final text would find, in order
and without overlaps, as long as every match is within its bound (tests/core/safety prove it
over random splits). `^` is the stream start; `$` and look-arounds at the end of the held text
wait for more text. Look-behind sees up to `max_length` characters of already released text.
"""

from __future__ import annotations

from proxy.core.safety.rules import RegexRule


class RegexScanner:
    """One stream's scan of one rule. Positions are absolute character offsets in the stream."""

    __slots__ = ("_next", "rule")

    def __init__(self, rule: RegexRule) -> None:
        self.rule = rule
        self._next = 0  # where the next search starts

    def scan(self, text: str, base: int, *, final: bool) -> tuple[list[tuple[int, int]], int]:
        """Scan `text` (which starts at stream offset `base`): (matches, hold position).

        Every match is `(start, end)`; the hold position is the first character that must not
        be released yet (`base + len(text)` when nothing is held).
        """
        pattern = self.rule.pattern
        bound = self.rule.max_length
        end = len(text)
        pos = max(self._next - base, 0)
        matches: list[tuple[int, int]] = []
        hold = end
        while pos <= end:
            found = pattern.search(text, pos, partial=not final)
            if found is None:
                pos = end
                break
            start, stop = found.span()
            if found.partial:
                if end - start < bound:
                    hold = pos = start
                    break
                pos = start + 1  # an unbounded candidate: no match of ours starts here
                continue
            if stop == start:
                pos = start + 1  # empty matches (look-arounds alone) ban nothing
                continue
            if (
                not final
                and end - start < bound
                and pattern.fullmatch(text, start, partial=True) is not None
            ):
                hold = pos = start
                break
            matches.append((base + start, base + stop))
            pos = stop
        self._next = base + min(pos, end)
        return matches, base + hold
