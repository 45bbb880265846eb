"""Cross-field checks on schema-valid maps (proxy.core.maps.checks)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.maps.checks import map_problems
from proxy.core.maps.content import BYTE_TOKENS
from proxy.tokenizers.pretokenizers import QWEN2_PATTERN


def test_a_generated_map_has_no_problems(tiny_document: dict[str, Any]) -> None:
    assert map_problems(tiny_document) == []


def test_ids_must_be_below_vocab_size(tiny_document: dict[str, Any]) -> None:
    tiny_document["vocab_size"] = 10
    tiny_document["special_tokens"] = {"<|ctrl|>": 12}
    problems = map_problems(tiny_document)
    assert any("is not below vocab_size 10" in p and "vocab[" in p for p in problems)
    assert any(p.startswith("special_tokens['<|ctrl|>'] = 12") for p in problems)


def test_merges_need_their_parts_and_result(tiny_document: dict[str, Any]) -> None:
    tiny_document["merges"] = [*tiny_document["merges"], "q zz"]
    assert map_problems(tiny_document) == ["merge 'q zz' needs 'zz', which is not in vocab"]


def test_byte_fallback_range_must_hold_the_byte_tokens(tiny_document: dict[str, Any]) -> None:
    vocab = tiny_document["vocab"]
    base = max(vocab.values()) + 1
    vocab.update({token: base + i for i, token in enumerate(BYTE_TOKENS)})
    tiny_document["vocab_size"] = base + 256
    tiny_document.update(byte_fallback_start=base, byte_fallback_end=base + 255)
    assert map_problems(tiny_document) == []
    tiny_document["byte_fallback_end"] = base + 254
    assert map_problems(tiny_document) == [
        f"byte_fallback_start..end ({base}..{base + 254}) must span 256 ids"
    ]
    tiny_document.update(byte_fallback_start=base - 1, byte_fallback_end=base + 254)
    assert "is not <0x00> in vocab" in map_problems(tiny_document)[0]


def test_tool_calling_markers_must_be_special_tokens(tiny_document: dict[str, Any]) -> None:
    tiny_document["tool_calling"] = {
        "convention": "custom",
        "markers": {"start": "<|ctrl|>", "end": "</tool>"},
        "args_format": "json",
        "result_format": "text",
    }
    assert map_problems(tiny_document) == ["tool_calling marker '</tool>' is not in special_tokens"]


def test_pattern_must_compile(tiny_document: dict[str, Any]) -> None:
    tiny_document["pre_tokenizer_pattern"] = "(unclosed"
    assert map_problems(tiny_document)[0].startswith("pre_tokenizer_pattern does not compile")


def test_program_must_agree_with_the_pattern(tiny_document: dict[str, Any]) -> None:
    tiny_document["pre_tokenizer_pattern"] = QWEN2_PATTERN  # numbers max_run 1, not 3
    assert map_problems(tiny_document) == [
        "pre_tokenizer_program says something else than pre_tokenizer_pattern"
    ]


@pytest.mark.parametrize(
    "op", [{"op": "metaspace_split"}, {"op": "literals_ci", "patterns": ["("]}]
)
def test_byte_level_program_ops_need_a_regex_form(
    tiny_document: dict[str, Any], op: dict[str, Any]
) -> None:
    tiny_document["pre_tokenizer_program"] = {"version": 1, "ops": [op]}
    assert map_problems(tiny_document)[0].startswith("pre_tokenizer_program: ")
