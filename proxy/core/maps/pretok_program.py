"""`pre_tokenizer_program` op set v1: a pre-tokenizer regex written as named ops, and back.

A map's `pre_tokenizer_pattern` needs a Unicode regex engine; the program (map schema v2.1,
Codec `spec/PRETOKENIZER_PROGRAM.md`) says the same thing as an ordered list of ops, each a
fixed regex shape. The interpreter tries the ops in order at each position and the first that
matches wins, which is exactly how a regex alternation of those shapes behaves. So a pattern
fits op set v1 when it is an alternation whose every alternative is one op's shape, and the
program is then a lossless rewrite of it (and `program_pattern` writes it back).

Shapes are recognised literally, not by regex semantics: only the forms real tokenizers ship
are listed (GPT-2-family alternations as in Llama-3 and Qwen2, in Hugging Face's `(?i:...)` and
llama.cpp's case-folding-free spelling). Anything else has no program, and the map carries the
pattern alone, which the spec allows ("emit `pre_tokenizer_program: null`", PRETOKENIZER_PROGRAM
§ Compatibility).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import TokenizerMapError

PROGRAM_VERSION = 1

# Exact regex spelling of each fixed-shape op, as PRETOKENIZER_PROGRAM defines them.
_LETTERS_LEAD_OTHER = r"[^\r\n\p{L}\p{N}]?\p{L}+"
_LETTERS = r"\p{L}+"
_NUMBERS = r"\p{N}+"
_NUMBERS_BOUNDED = re.compile(r"\\p\{N\}\{1,([1-9][0-9]*)\}")
_PUNCT_BODY = r"[^\s\p{L}\p{N}]+"
_LEAD_SPACE = " ?"
_TRAILING_NEWLINES = r"[\r\n]*"
_NEWLINE_BLOCK = r"\s*[\r\n]+"
_TRAILING_WS = r"\s+(?!\S)"
_WS_RUN = r"\s+"

# literals_ci in Hugging Face's spelling `(?i:'s|'t|...)` and in llama.cpp's, which has no
# inline flags and spells each letter as a two-case class: `(?:'[sS]|'[tT]|...)`.
_CI_GROUP = re.compile(r"\(\?i:(.*)\)", re.S)
_PLAIN_GROUP = re.compile(r"\(\?:(.*)\)", re.S)
_TWO_CASE_CLASS = re.compile(r"\[([a-zA-Z])([a-zA-Z])\]")
_REGEX_META = frozenset("\\^$.|?*+()[]{}")


@dataclass(frozen=True)
class ProgramOp:
    """One op of a program: its name and its parameters, in the order they are written."""

    op: str
    params: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, **dict(self.params)}


@dataclass(frozen=True)
class PreTokenizerProgram:
    ops: tuple[ProgramOp, ...]
    version: int = PROGRAM_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "ops": [op.to_json() for op in self.ops]}


def split_alternation(pattern: str) -> list[str]:
    """The top-level alternatives of a regex: `a|(b|c)|[|]` -> `a`, `(b|c)`, `[|]`."""
    alternatives: list[str] = []
    depth = 0
    in_class = False
    start = 0
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A `]` right after `[` or `[^` is a literal member, not the end of the class.
            if pattern[index + 1 : index + 2] == "^":
                index += 1
            if pattern[index + 1 : index + 2] == "]":
                index += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            alternatives.append(pattern[start:index])
            start = index + 1
        index += 1
    alternatives.append(pattern[start:])
    return alternatives


def _plain_literal(text: str) -> bool:
    return bool(text) and not any(char in _REGEX_META for char in text)


def _two_case_literal(item: str) -> str | None:
    """`'[rR][eE]` -> `'re`; None if any ASCII letter is not spelled in both cases."""
    literal: list[str] = []
    position = 0
    for match in _TWO_CASE_CLASS.finditer(item):
        lower, upper = match.groups()
        if lower == upper or lower.lower() != upper.lower():
            return None
        literal += [item[position : match.start()], lower.lower()]
        position = match.end()
    literal.append(item[position:])
    bare = "".join(literal[0::2])
    if any(char.isascii() and char.isalpha() for char in bare):
        return None
    text = "".join(literal)
    return text if _plain_literal(text) else None


def _case_insensitive_literals(alternative: str) -> list[str] | None:
    """The literals of a case-insensitive literal group, lowercase, or None if it is not one."""
    literals: list[str | None]
    if (match := _CI_GROUP.fullmatch(alternative)) is not None:
        literals = [
            item.lower() if _plain_literal(item) else None
            for item in split_alternation(match.group(1))
        ]
    elif (match := _PLAIN_GROUP.fullmatch(alternative)) is not None:
        literals = [_two_case_literal(item) for item in split_alternation(match.group(1))]
    else:
        return None
    found = [literal for literal in literals if literal is not None]
    if len(found) != len(literals):
        return None
    # The op takes the longest literal that matches, the regex the first listed: the two agree
    # only when no literal is a proper prefix of another.
    if any(a != b and b.startswith(a) for a in found for b in found):
        return None
    return found


def _op_for(alternative: str) -> ProgramOp | None:
    fixed: Mapping[str, ProgramOp] = {
        _LETTERS_LEAD_OTHER: ProgramOp("letters", (("lead_other", True),)),
        _LETTERS: ProgramOp("letters", (("lead_other", False),)),
        _NUMBERS: ProgramOp("numbers"),
        _NEWLINE_BLOCK: ProgramOp("newline_block"),
        _TRAILING_WS: ProgramOp("trailing_ws"),
        _WS_RUN: ProgramOp("ws_run"),
    }
    if alternative in fixed:
        return fixed[alternative]
    if alternative == r"\p{N}":
        return ProgramOp("numbers", (("max_run", 1),))
    if (bounded := _NUMBERS_BOUNDED.fullmatch(alternative)) is not None:
        return ProgramOp("numbers", (("max_run", int(bounded.group(1))),))
    lead_space = alternative.startswith(_LEAD_SPACE)
    body = alternative.removeprefix(_LEAD_SPACE)
    trailing_newlines = body.endswith(_TRAILING_NEWLINES)
    if body.removesuffix(_TRAILING_NEWLINES) == _PUNCT_BODY:
        return ProgramOp(
            "punct_run", (("lead_space", lead_space), ("trailing_newlines", trailing_newlines))
        )
    literals = _case_insensitive_literals(alternative)
    if literals is not None:
        return ProgramOp("literals_ci", (("patterns", literals),))
    return None


def compile_program(pattern: str) -> PreTokenizerProgram | None:
    """The op set v1 program equivalent to `pattern`, or None when the pattern does not fit."""
    ops: list[ProgramOp] = []
    for alternative in split_alternation(pattern):
        op = _op_for(alternative)
        if op is None:
            return None
        ops.append(op)
    return PreTokenizerProgram(tuple(ops))


def _op_pattern(op: Mapping[str, Any]) -> str:
    name = op.get("op")
    if name == "literals_ci":
        patterns = op.get("patterns")
        if not isinstance(patterns, list) or not all(_plain_literal(p) for p in patterns):
            raise TokenizerMapError(f"literals_ci needs plain literal patterns, got {patterns!r}")
        return "(?i:" + "|".join(patterns) + ")"
    if name == "letters":
        return _LETTERS_LEAD_OTHER if op.get("lead_other") else _LETTERS
    if name == "numbers":
        max_run = op.get("max_run")
        if max_run is None:
            return _NUMBERS
        return r"\p{N}" if max_run == 1 else r"\p{N}{1," + str(int(max_run)) + "}"
    if name == "punct_run":
        lead = _LEAD_SPACE if op.get("lead_space") else ""
        trail = _TRAILING_NEWLINES if op.get("trailing_newlines") else ""
        return lead + _PUNCT_BODY + trail
    simple = {"newline_block": _NEWLINE_BLOCK, "trailing_ws": _TRAILING_WS, "ws_run": _WS_RUN}
    if isinstance(name, str) and name in simple:
        return simple[name]
    # metaspace_split is a SentencePiece splitter, not a regex alternative (see TOKENIZER_MAPS.md).
    raise TokenizerMapError(f"pre_tokenizer_program op {name!r} has no regex form")


def program_pattern(ops: Sequence[Mapping[str, Any]]) -> str:
    """The regex a program's ops stand for: how a map with only a program is tokenized."""
    if not ops:
        raise TokenizerMapError("pre_tokenizer_program has no ops")
    return "|".join(_op_pattern(op) for op in ops)
