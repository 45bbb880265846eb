"""What a tokenizer map must satisfy beyond its JSON Schema, for a tokenizer to be built from it.

The schema checks shapes; these checks relate the fields to each other (codec-spec.md §7):
ids inside `vocab_size`, BPE merges over tokens that exist, a byte-fallback range that really
holds `<0x00>`..`<0xFF>`, tool-calling markers among the special tokens, a pattern that
compiles, and a program that says what the pattern says. Run them on schema-valid documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import Regex

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.content import BYTE_TOKENS
from proxy.core.maps.pretok_program import compile_program, program_pattern

_LIMIT = 10


def _vocab_problems(document: Mapping[str, Any]) -> list[str]:
    vocab: Mapping[str, int] = document.get("vocab") or {}
    size: int = document["vocab_size"]
    problems = [
        f"vocab[{token!r}] = {index} is not below vocab_size {size}"
        for token, index in vocab.items()
        if index >= size
    ][:_LIMIT]
    for name, index in (document.get("special_tokens") or {}).items():
        if index >= size:
            problems.append(f"special_tokens[{name!r}] = {index} is not below vocab_size {size}")
    return problems


def _merge_problems(document: Mapping[str, Any]) -> list[str]:
    vocab: Mapping[str, int] = document.get("vocab") or {}
    problems = []
    # A plain loop: Llama-3 has 280k merges, and this runs on every map load.
    for merge in document.get("merges") or ():
        left, _, right = merge.partition(" ")
        if left in vocab and right in vocab and left + right in vocab:
            continue
        missing = next(part for part in (left, right, left + right) if part not in vocab)
        problems.append(f"merge {merge!r} needs {missing!r}, which is not in vocab")
        if len(problems) == _LIMIT:
            break
    return problems


def _byte_fallback_problems(document: Mapping[str, Any]) -> list[str]:
    start = document.get("byte_fallback_start")
    end = document.get("byte_fallback_end")
    if start is None or end is None:
        return []
    if end - start != 255:
        return [f"byte_fallback_start..end ({start}..{end}) must span 256 ids"]
    vocab: Mapping[str, int] = document.get("vocab") or {}
    wrong = [
        token for offset, token in enumerate(BYTE_TOKENS) if vocab.get(token) != start + offset
    ]
    if vocab and wrong:
        return [f"byte-fallback id {vocab.get(wrong[0])} is not {wrong[0]} in vocab"]
    return []


def _tool_calling_problems(document: Mapping[str, Any]) -> list[str]:
    tool_calling = document.get("tool_calling")
    if tool_calling is None:
        return []
    special = document.get("special_tokens") or {}
    markers = tool_calling["markers"]
    return [
        f"tool_calling marker {markers[end]!r} is not in special_tokens"
        for end in ("start", "end")
        if markers[end] not in special
    ]


def _pre_tokenizer_problems(document: Mapping[str, Any]) -> list[str]:
    pattern = document.get("pre_tokenizer_pattern")
    program = document.get("pre_tokenizer_program")
    problems = []
    if pattern is not None:
        try:
            Regex(pattern)
        except Exception as exc:  # tokenizers raises a bare Exception for a bad regex
            problems.append(f"pre_tokenizer_pattern does not compile: {exc}")
    if program is None:
        return problems
    if document.get("encoder") == "byte_level":
        try:
            program_pattern(program["ops"])
        except TokenizerMapError as exc:
            problems.append(f"pre_tokenizer_program: {exc.message}")
            return problems
    if pattern is not None and not problems:
        # Only a pattern we can rewrite ourselves can be compared; the spec requires the two
        # to produce the same pieces (PRETOKENIZER_PROGRAM § Equivalence).
        ours = compile_program(pattern)
        if ours is not None and ours.to_json() != program:
            problems.append("pre_tokenizer_program says something else than pre_tokenizer_pattern")
    return problems


def map_problems(document: Mapping[str, Any]) -> list[str]:
    """Every cross-field problem of a schema-valid map document, each one line."""
    return [
        *_vocab_problems(document),
        *_merge_problems(document),
        *_byte_fallback_problems(document),
        *_tool_calling_problems(document),
        *_pre_tokenizer_problems(document),
    ]


def _first_difference(expected: Any, actual: Any) -> str:
    if isinstance(expected, dict) and isinstance(actual, dict):
        missing = [key for key in expected if key not in actual]
        extra = [key for key in actual if key not in expected]
        changed = [key for key in expected if key in actual and expected[key] != actual[key]]
        parts = [
            f"{len(items)} {what} (e.g. {items[0]!r})"
            for items, what in ((missing, "missing"), (extra, "extra"), (changed, "changed"))
            if items
        ]
        return ", ".join(parts)
    if isinstance(expected, list) and isinstance(actual, list):
        index = next(
            (i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
            min(len(expected), len(actual)),
        )
        return (
            f"{len(actual)} entries where {len(expected)} are expected, first difference at {index}"
        )
    return f"{actual!r} where {expected!r} is expected"


def map_differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Where a map disagrees with the map generated from the tokenizer it claims to describe.

    `id`, `published_at` and `zstd_dictionaries` are the publisher's choices, not the
    tokenizer's, and are not compared.
    """
    ignored = {"id", "published_at", "zstd_dictionaries"}
    keys = [key for key in {**expected, **actual} if key not in ignored]
    return [
        f"{key}: {_first_difference(expected.get(key), actual.get(key))}"
        for key in keys
        if expected.get(key) != actual.get(key)
    ]
