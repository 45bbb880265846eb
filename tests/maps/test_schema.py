"""The packaged JSON Schema: a valid draft-07 schema that accepts our maps and names what is
wrong with broken ones, in one short line each."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from proxy.maps.schema import map_schema, schema_problems

HASH = "sha256:" + "0f" * 32


def test_the_schema_is_valid_draft_07() -> None:
    schema = map_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert jsonschema_rs.meta.is_valid(schema)
    assert schema["additionalProperties"] is False


def test_a_generated_map_is_valid(tiny_document: dict[str, Any]) -> None:
    assert schema_problems(tiny_document) == []


def test_the_deprecated_tokens_form_is_valid(tiny_document: dict[str, Any]) -> None:
    del tiny_document["vocab"]
    tiny_document["tokens"] = {"0": "a"}
    assert schema_problems(tiny_document) == []


BREAKAGES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"encoder_type": "byte_level"}, "$: Additional properties"),
    ("numeric version", {"version": 2}, "$.version:"),
    ("empty vocab size", {"vocab_size": 0}, "$.vocab_size:"),
    ("unknown encoder", {"encoder": "bpe"}, "$.encoder:"),
    ("merge with two spaces", {"merges": ["a  b"]}, "$.merges[0]:"),
    ("negative id", {"vocab": {"a": -1}}, "$.vocab.a:"),
    ("unknown op", {"pre_tokenizer_program": {"version": 1, "ops": [{"op": "x"}]}}, "$.pre_tok"),
    ("program v2", {"pre_tokenizer_program": {"version": 2, "ops": [{"op": "ws_run"}]}}, "$.pre"),
    (
        "op extra field",
        {"pre_tokenizer_program": {"version": 1, "ops": [{"op": "ws_run", "x": 1}]}},
        "$.pre",
    ),
    (
        "uppercase dict hash",
        {
            "zstd_dictionaries": [
                {"format": "msgpack", "url": "u", "hash": HASH.upper(), "size_bytes": 1}
            ]
        },
        "$.zstd_dictionaries[0].hash:",
    ),
    (
        "dict without size",
        {"zstd_dictionaries": [{"format": "msgpack", "url": "u", "hash": HASH}]},
        "$.zstd_dictionaries[0]:",
    ),
    (
        "dict extra field",
        {
            "zstd_dictionaries": [
                {"format": "msgpack", "url": "u", "hash": HASH, "size_bytes": 1, "level": 3}
            ]
        },
        "$.zstd_dictionaries[0]:",
    ),
    ("bad timestamp", {"published_at": "yesterday"}, "$.published_at:"),
    ("half a byte range", {"byte_fallback_start": 3}, '$: "byte_fallback_end" is a required'),
    ("other half", {"byte_fallback_end": 258}, '$: "byte_fallback_start" is a required'),
    (
        "unknown tool convention",
        {
            "tool_calling": {
                "convention": "x",
                "markers": {"start": "a", "end": "b"},
                "args_format": "json",
                "result_format": "text",
            }
        },
        "$.tool_calling.convention:",
    ),
]


@pytest.mark.parametrize(("name", "change", "where"), BREAKAGES, ids=[b[0] for b in BREAKAGES])
def test_breakages_are_named(
    tiny_document: dict[str, Any], name: str, change: dict[str, Any], where: str
) -> None:
    tiny_document.update(change)
    problems = schema_problems(tiny_document)
    assert problems, name
    assert any(problem.startswith(where) for problem in problems), problems


def test_byte_level_needs_a_pattern_or_a_program(tiny_document: dict[str, Any]) -> None:
    del tiny_document["pre_tokenizer_pattern"]
    program = tiny_document.pop("pre_tokenizer_program")
    assert schema_problems(tiny_document)
    tiny_document["pre_tokenizer_program"] = program
    assert schema_problems(tiny_document) == []


def test_without_vocab_or_tokens_is_invalid(tiny_document: dict[str, Any]) -> None:
    del tiny_document["vocab"]
    assert schema_problems(tiny_document)


def test_problems_stay_short_and_few(tiny_document: dict[str, Any]) -> None:
    tiny_document["vocab"] = ["x" * 10_000]
    tiny_document["merges"] = [1] * 50
    problems = schema_problems(tiny_document)
    assert len(problems) == 10
    assert all(len(problem) < 200 for problem in problems)
