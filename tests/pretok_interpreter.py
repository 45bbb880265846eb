"""An independent interpreter for `pre_tokenizer_program` op set v1, written from the spec prose.

Codec `spec/PRETOKENIZER_PROGRAM.md`: at each position try the ops in order; the first that
matches a non-empty span emits it as a piece; if none matches, emit one scalar. The character
classes are Unicode's: `\\p{L}` is General_Category L*, `\\p{N}` is N*, `\\s` is White_Space.
No regex engine is used here, so comparing its pieces with the regex the proxy publishes checks
the program against the pattern rather than against itself.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
NEWLINES = frozenset("\r\n")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def is_letter(char: str) -> bool:
    return unicodedata.category(char).startswith("L")


def is_number(char: str) -> bool:
    return unicodedata.category(char).startswith("N")


def is_space(char: str) -> bool:
    return char in WHITE_SPACE


def _run(text: str, start: int, test: Callable[[str], bool], limit: int | None = None) -> int:
    end = start
    while end < len(text) and test(text[end]) and (limit is None or end - start < limit):
        end += 1
    return end


def _literals_ci(text: str, at: int, op: Mapping[str, Any]) -> int:
    folded = text[at:].translate(_ASCII_LOWER)
    lengths = [len(p) for p in op["patterns"] if folded.startswith(p.translate(_ASCII_LOWER))]
    return max(lengths, default=0)


def _letters(text: str, at: int, op: Mapping[str, Any]) -> int:
    start = at
    if op.get("lead_other") and at < len(text):
        char = text[at]
        lead = char not in NEWLINES and not is_letter(char) and not is_number(char)
        if lead and at + 1 < len(text) and is_letter(text[at + 1]):
            start = at + 1
    end = _run(text, start, is_letter)
    return end - at if end > start else 0


def _numbers(text: str, at: int, op: Mapping[str, Any]) -> int:
    return _run(text, at, is_number, op.get("max_run")) - at


def _is_punct(char: str) -> bool:
    return not is_space(char) and not is_letter(char) and not is_number(char)


def _punct_run(text: str, at: int, op: Mapping[str, Any]) -> int:
    start = at
    following = text[at + 1 : at + 2]
    if op.get("lead_space") and text[at : at + 1] == " " and following and _is_punct(following):
        start = at + 1
    end = _run(text, start, _is_punct)
    if end == start:
        return 0
    if op.get("trailing_newlines"):
        end = _run(text, end, lambda char: char in NEWLINES)
    return end - at


def _newline_block(text: str, at: int, op: Mapping[str, Any]) -> int:
    end = _run(text, at, is_space)
    last_newline = max((i for i in range(at, end) if text[i] in NEWLINES), default=-1)
    return last_newline + 1 - at if last_newline >= 0 else 0


def _trailing_ws(text: str, at: int, op: Mapping[str, Any]) -> int:
    end = _run(text, at, is_space)
    if end == len(text):
        return end - at
    # Followed by a non-space: give the last space back, so what follows it is a space.
    return max(end - 1 - at, 0)


def _ws_run(text: str, at: int, op: Mapping[str, Any]) -> int:
    return _run(text, at, is_space) - at


OPS: dict[str, Callable[[str, int, Mapping[str, Any]], int]] = {
    "literals_ci": _literals_ci,
    "letters": _letters,
    "numbers": _numbers,
    "punct_run": _punct_run,
    "newline_block": _newline_block,
    "trailing_ws": _trailing_ws,
    "ws_run": _ws_run,
}


def run_program(ops: Sequence[Mapping[str, Any]], text: str) -> list[str]:
    """The pieces op set v1 cuts `text` into."""
    pieces = []
    at = 0
    while at < len(text):
        length = next((n for op in ops if (n := OPS[op["op"]](text, at, op)) > 0), 1)
        pieces.append(text[at : at + length])
        at += length
    return pieces
