"""The one parser for JSON request bodies, and how it reads a long array of token IDs.

orjson, not the standard `json`: it refuses what must not reach the backend as JSON again (a lone
surrogate in a string, RFC 8259 §8.2; nesting deeper than 1024) with a `JSONDecodeError`, where
`json` accepts the first (and `json.dumps` then fails on it) and overflows the stack on the
second. Both are a 400 `invalid_json` here.

A token-ID prompt can be most of a 32 MiB body. One `orjson.loads` over it holds the interpreter
for seconds, and a worker thread does not help, since the loop cannot run until that call
returns. So the longest run of bytes that can only be an array of integers (digits, `-`, `,`,
whitespace, between `[` and `]`) is cut out first: the rest of the body is parsed with a marker
string in its place (random, so no client can send it), and when the marker lands where a
token-ID prompt can be (a top-level field, or the first item of one), the run is counted (its
commas, so a caller can refuse too many IDs before any is parsed) and parsed later in slices
cut at commas. Anywhere else (inside a string, deeper) the whole body is parsed at once: the
result is always what `orjson.loads` of the whole body gives.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.core.errors import BadRequest
from proxy.core.shown import quoted

# Shorter runs are parsed with the rest: 64 KiB of IDs is about a millisecond of orjson.
MIN_RUN: Final = 64 * 1024
# Bytes per orjson call when a run is parsed in slices (about 10 000 IDs).
SLICE_BYTES: Final = 64 * 1024
# Bytes per scan (translate, count) of the body: a millisecond or two each.
WINDOW_BYTES: Final = 1 << 20
# What an array of integers is made of between its brackets (RFC 8259 §2, §5, §6: no fraction
# or exponent, so every number in such a run is an integer).
_INTEGER_ARRAY_BYTES: Final = frozenset(b"0123456789-, \t\n\r")
_CLASSES: Final = bytes(ord("n" if byte in _INTEGER_ARRAY_BYTES else "x") for byte in range(256))


def invalid_json(detail: str) -> BadRequest:
    return BadRequest(f"request body is not valid JSON: {detail}", code="invalid_json")


@dataclass(eq=False)
class PendingIds:
    """A long array of numbers found at `body[key]` (or `body[key][0]`), not parsed yet: the
    bytes `raw[start:end]` between its brackets.

    `items` is that list in the parsed body; `complete()` fills it in place.
    """

    key: str
    items: list[Any]
    raw: bytes
    start: int
    end: int
    slice_bytes: int = SLICE_BYTES

    @property
    def count(self) -> int:
        """How many elements the array has, if it is valid JSON (checked when parsed)."""
        if self._blank():
            return 0
        windows = range(self.start, self.end, WINDOW_BYTES)
        commas = sum(self.raw.count(b",", w, min(w + WINDOW_BYTES, self.end)) for w in windows)
        return commas + 1

    def complete(self) -> None:
        items, raw, start, end = self.items, self.raw, self.start, self.end
        # Sized once: growing a list of millions by appends copies it, in one call, each time
        # it is reallocated. A valid run has exactly `count` elements; an invalid one raises.
        count = self.count
        items[:] = itertools.repeat(None, count)
        filled = 0
        while count:  # `[ ]` has nothing to parse
            # Cut only at commas: every comma in such a run separates two elements.
            cut = raw.find(b",", start + self.slice_bytes, end)
            piece = raw[start : end if cut == -1 else cut]
            try:
                part = orjson.loads(b"[" + piece + b"]")
            except orjson.JSONDecodeError as exc:
                raise invalid_json(f"in the array of {quoted(self.key)}: {exc}") from exc
            if not part:  # `[1,,2]` or `[1,]`: an empty slice between two commas
                raise invalid_json(f"in the array of {quoted(self.key)}: an element is missing")
            items[filled : filled + len(part)] = part
            filled += len(part)
            if cut == -1:
                return
            start = cut + 1

    def _blank(self) -> bool:
        """Only whitespace: `[ ]`, an empty array."""
        windows = range(self.start, self.end, WINDOW_BYTES)
        return not any(self.raw[w : min(w + WINDOW_BYTES, self.end)].strip() for w in windows)


@dataclass(eq=False)
class JsonObject:
    """A parsed JSON object, complete unless `pending` still has to be parsed into it."""

    value: dict[str, Any]
    pending: PendingIds | None = field(default=None)

    def complete(self) -> dict[str, Any]:
        if self.pending is not None:
            self.pending.complete()
            self.pending = None
        return self.value


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object body, whole; `BadRequest` (`invalid_json`) for anything else."""
    return read_json_object(raw).complete()


def read_json_object(
    raw: bytes, *, min_run: int = MIN_RUN, slice_bytes: int = SLICE_BYTES
) -> JsonObject:
    """A JSON object body, with its longest array of integers left `pending` when it is long
    and sits at `body[key]` or `body[key][0]`."""
    run = _longest_integer_array(raw, min_run)
    if run is not None:
        start, end = run
        marker = f"codec-proxy-ids-{secrets.token_hex(16)}"
        # A marker cut into a string ends that string and is followed by a letter: never
        # valid JSON, so that case always falls back to parsing the whole body.
        skeleton = b"".join((raw[:start], b'"', marker.encode(), b'"', raw[end:]))
        try:
            value = orjson.loads(skeleton)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            found = _find_marker(value, marker)
            if found is not None:
                key, items = found
                return JsonObject(value, PendingIds(key, items, raw, start, end, slice_bytes))
    return JsonObject(_loads_object(raw))


def _loads_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(str(exc)) from exc
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return value


def _longest_integer_array(raw: bytes, min_run: int) -> tuple[int, int] | None:
    """(start, end) of the longest run of at least `min_run` integer-array bytes that sits
    right between a `[` and a `]`; None when there is none."""
    best: tuple[int, int] | None = None
    start = _next_run(raw, 0, min_run)
    while start is not None:
        end = _run_end(raw, start + min_run)
        bracketed = raw[start - 1 : start] == b"[" and raw[end : end + 1] == b"]"
        if bracketed and (best is None or end - start > best[1] - best[0]):
            best = (start, end)
        start = _next_run(raw, end, min_run)
    return best


def _next_run(raw: bytes, position: int, min_run: int) -> int | None:
    """Where the first run of at least `min_run` integer-array bytes from `position` starts.

    `position` is 0 or a run's end, so the first match is a run's start: any earlier start
    would have matched. Windows overlap by `min_run - 1` bytes so no run is cut in two.
    """
    needle = b"n" * min_run
    for window in range(position, len(raw), WINDOW_BYTES):
        classes = raw[window : window + WINDOW_BYTES + min_run - 1].translate(_CLASSES)
        found = classes.find(needle)
        if found != -1:
            return window + found
    return None


def _run_end(raw: bytes, position: int) -> int:
    """The first byte from `position` on that cannot be in an array of integers, or the end."""
    for window in range(position, len(raw), WINDOW_BYTES):
        found = raw[window : window + WINDOW_BYTES].translate(_CLASSES).find(b"x")
        if found != -1:
            return window + found
    return len(raw)


def _find_marker(body: dict[str, Any], marker: str) -> tuple[str, list[Any]] | None:
    for key, value in body.items():
        for candidate in (value, value[0] if type(value) is list and value else None):
            if type(candidate) is list and len(candidate) == 1 and candidate[0] == marker:
                return key, candidate
    return None
