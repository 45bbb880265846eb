"""The policy matcher: a stream's tokens (ID and text) in, what may be released out.

Three detectors look at the same tokens: an Aho-Corasick automaton over token IDs (banned IDs
and ID sequences), one over characters (banned strings), and one `RegexScanner` per regex.
Each says which matches completed and from where it must still hold back; the matcher releases
the tokens before the earliest hold, so a clean stream is delayed only while a rule could still
match (at most: the longest ID sequence - 1 tokens, the longest string - 1 characters, a
regex's `max_length` - 1 characters, whichever reaches furthest back).

Actions (codec-spec.md §8):

* `stop`: the first offending span (earliest start) ends the stream. Nothing from it on is
  released; text before it that a rule was still inspecting is dropped with it.
* `redact`: the tokens of the span are replaced by the category's placeholder and the stream
  goes on. Detectors keep scanning the original text, so a stop rule that contains a redactable
  part still fires; overlapping redactions merge into one placeholder.

Matches are found on text (strings, regexes) or IDs, but acted on in whole tokens: a token that
carries any character of a match belongs to the span. A token whose bytes complete no character
yet (a partial UTF-8 sequence) is attributed to the character it starts, so an emoji split over
two tokens is released, redacted or dropped as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.safety.automaton import Cursor
from proxy.core.safety.regex_scan import RegexScanner
from proxy.core.safety.rules import CompiledRules


@dataclass(frozen=True, slots=True)
class MatchOutput:
    """Released tokens (placeholders included) and what happened to get them."""

    ids: tuple[int, ...] = ()
    text: str = ""
    # The category of the `stop` rule that ended the stream, if one did.
    stop: str | None = None
    # The categories redacted in this output, one per placeholder.
    redactions: tuple[str, ...] = ()

    def then(self, later: MatchOutput) -> MatchOutput:
        """This output followed by a later one (nothing follows a stop)."""
        if self.stop is not None:
            return self
        return MatchOutput(
            self.ids + later.ids,
            self.text + later.text,
            later.stop,
            self.redactions + later.redactions,
        )


_NOTHING = MatchOutput()


class PolicyMatcher:
    """One stream's enforcement state. `feed()` any number of times, then `flush()` once."""

    def __init__(self, rules: CompiledRules) -> None:
        self._rules = rules
        self._id_cursor = Cursor(rules.ids)
        self._char_cursor = Cursor(rules.strings)
        self._scanners = [RegexScanner(rule) for rule in rules.regexes]
        self._context_chars = rules.context_chars
        # Held tokens: parallel lists; `_first` is the stream index of the first one.
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._starts: list[int] = []
        self._first = 0
        self._chars = 0  # characters seen so far
        self._context = ""  # the end of the released text, for regex look-behind
        self._redactions: list[tuple[int, int, str]] = []  # token spans, sorted, disjoint
        self._stop: tuple[int, str] | None = None
        self._finished = False

    @property
    def held(self) -> int:
        """Tokens received but not released yet."""
        return len(self._ids)

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, ids: Sequence[int], texts: Sequence[str]) -> MatchOutput:
        """The next tokens (IDs and their text, in order); what can be released now."""
        if self._finished or not ids:
            return _NOTHING
        first_new = self._first + len(self._ids)
        first_char = self._chars
        for token, text in zip(ids, texts, strict=True):
            self._ids.append(token)
            self._texts.append(text)
            self._starts.append(self._chars)
            self._chars += len(text)
        end = self._first + len(self._ids)
        rules = self._rules
        if rules.ids.longest:
            for stop, hit in self._id_cursor.feed(ids, first_new):
                self._record(stop - hit.length, stop, rules.id_categories[hit.pattern])
        if rules.strings.longest:
            for stop, hit in self._char_cursor.feed("".join(texts), first_char):
                self._record_chars(stop - hit.length, stop, rules.string_categories[hit.pattern])
        hold_char = min(self._scan_regexes(final=False), self._chars - self._char_cursor.pending)
        return self._release(min(end - self._id_cursor.pending, self._token_at(hold_char)))

    def flush(self) -> MatchOutput:
        """End of stream: whatever is held is final now."""
        if self._finished:
            return _NOTHING
        self._scan_regexes(final=True)
        output = self._release(self._first + len(self._ids))
        self._finished = True
        return output

    # --- detection ------------------------------------------------------------------------

    def _scan_regexes(self, *, final: bool) -> int:
        if not self._scanners:
            return self._chars
        pending_start = self._starts[0] if self._starts else self._chars
        text = self._context + "".join(self._texts)
        base = pending_start - len(self._context)
        hold = self._chars
        for scanner in self._scanners:
            matches, scanner_hold = scanner.scan(text, base, final=final)
            for start, stop in matches:
                self._record_chars(start, stop, scanner.rule.category)
            hold = min(hold, scanner_hold)
        return hold

    def _record_chars(self, start: int, stop: int, category: str) -> None:
        first = self._token_at(start)
        end = self._first + len(self._ids)
        for index, begins in enumerate(self._starts):
            if begins >= stop:
                end = self._first + index
                break
        self._record(first, end, category)

    def _record(self, first: int, end: int, category: str) -> None:
        first = max(first, self._first)  # released text cannot be recalled (nor can it match)
        if end <= first:
            return
        if self._rules.actions[category] == "stop":
            if self._stop is None or first < self._stop[0]:
                self._stop = (first, category)
            return
        merged_first, merged_end, merged_category = first, end, category
        kept = []
        for span in self._redactions:
            if span[1] <= merged_first or span[0] >= merged_end:
                kept.append(span)
                continue
            if span[0] <= merged_first:
                merged_category = span[2]
            merged_first, merged_end = min(merged_first, span[0]), max(merged_end, span[1])
        kept.append((merged_first, merged_end, merged_category))
        kept.sort()
        self._redactions = kept

    def _drop(self, count: int, released_text: str) -> None:
        if self._context_chars:
            self._context = (self._context + released_text)[-self._context_chars :]
        del self._ids[:count], self._texts[:count], self._starts[:count]

    def _token_at(self, char: int) -> int:
        """The first held token that carries (part of) character `char` or anything later."""
        if char >= self._chars and (not self._texts or self._texts[-1]):
            return self._first + len(self._ids)  # nothing held back (no partial character)
        for index, begins in enumerate(self._starts):
            text = self._texts[index]
            if begins + len(text) > char or (not text and begins >= char):
                return self._first + index
        return self._first + len(self._ids)

    # --- release --------------------------------------------------------------------------

    def _release(self, limit: int) -> MatchOutput:
        stop = self._stop
        if stop is not None:
            limit = min(limit, stop[0])
        for first, end, _ in self._redactions:
            if first < limit < end:
                limit = first  # a redacted span leaves whole, as one placeholder
        limit = max(limit, self._first)
        count = limit - self._first
        if count == 0 and stop is None:
            return _NOTHING
        if stop is None and not self._redactions:
            # The common case, once per feed of a clean stream: a plain prefix leaves.
            ids_out = tuple(self._ids[:count])
            text_out = "".join(self._texts[:count])
            self._drop(count, text_out)
            self._first = limit
            return MatchOutput(ids_out, text_out)
        ids: list[int] = []
        texts: list[str] = []
        redacted: list[str] = []
        cursor = self._first
        remaining = []
        for first, end, category in self._redactions:
            if first >= limit:
                remaining.append((first, end, category))
                continue
            ids += self._ids[cursor - self._first : first - self._first]
            texts += self._texts[cursor - self._first : first - self._first]
            placeholder = self._rules.placeholders[category]
            ids += placeholder.ids
            texts.append(placeholder.text)
            redacted.append(category)
            cursor = end
        ids += self._ids[cursor - self._first : count]
        texts += self._texts[cursor - self._first : count]
        self._redactions = remaining
        self._drop(count, "".join(self._texts[:count]))
        self._first = limit
        if stop is None:
            return MatchOutput(tuple(ids), "".join(texts), None, tuple(redacted))
        # Nothing after a stop is ever released: the offending span and all that followed.
        self._finished = True
        self._ids.clear()
        self._texts.clear()
        self._starts.clear()
        return MatchOutput(tuple(ids), "".join(texts), stop[1], tuple(redacted))
