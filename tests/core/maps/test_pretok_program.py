"""pre_tokenizer_program op set v1: which patterns fit, and that the program cuts text exactly
as the pattern does (checked with an interpreter written from the spec, not with a regex)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.pretok_patterns import DIGITS_THEN_GPT2_PATTERN, GPT2_PATTERN
from proxy.core.maps.pretok_program import compile_program, program_pattern, split_alternation
from proxy.tokenizers.pretokenizers import LLAMA3_PATTERN, QWEN2_PATTERN
from proxy.tokenizers.probes import PROBE_STRINGS
from tests.pretok_interpreter import run_program

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
# Hugging Face's spelling of the same patterns (Llama-3 and Qwen tokenizer.json files).
HF_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
HF_QWEN2_PATTERN = HF_LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
FITTING = {
    "llama.cpp llama3": LLAMA3_PATTERN,
    "llama.cpp qwen2": QWEN2_PATTERN,
    "hf llama3": HF_LLAMA3_PATTERN,
    "hf qwen2": HF_QWEN2_PATTERN,
}


def gpt2_family_ops(max_run: int | None) -> list[dict[str, Any]]:
    numbers: dict[str, Any] = {"op": "numbers"}
    if max_run is not None:
        numbers["max_run"] = max_run
    return [
        {"op": "literals_ci", "patterns": CONTRACTIONS},
        {"op": "letters", "lead_other": True},
        numbers,
        {"op": "punct_run", "lead_space": True, "trailing_newlines": True},
        {"op": "newline_block"},
        {"op": "trailing_ws"},
        {"op": "ws_run"},
    ]


@pytest.mark.parametrize(
    ("pattern", "max_run"),
    [(LLAMA3_PATTERN, 3), (HF_LLAMA3_PATTERN, 3), (QWEN2_PATTERN, 1), (HF_QWEN2_PATTERN, 1)],
)
def test_gpt2_family_alternations_compile_to_the_spec_programs(pattern: str, max_run: int) -> None:
    program = compile_program(pattern)
    assert program is not None
    assert program.to_json() == {"version": 1, "ops": gpt2_family_ops(max_run)}


@pytest.mark.parametrize(
    "pattern",
    [
        GPT2_PATTERN,  # case-sensitive contractions and " ?\p{L}+" are not v1 ops
        DIGITS_THEN_GPT2_PATTERN,
        r"(?i:'s|'st)|\s+",  # the op takes the longest literal, the regex the first
        r"(?:'[sS]|'t)|\s+",  # a bare letter is case-sensitive
        r"(?:'[sT])|\s+",
        r"\p{L}+|\w+",
        "",
    ],
)
def test_patterns_outside_op_set_v1_have_no_program(pattern: str) -> None:
    assert compile_program(pattern) is None


def test_program_pattern_round_trips() -> None:
    for pattern in FITTING.values():
        program = compile_program(pattern)
        assert program is not None
        rewritten = program_pattern(program.to_json()["ops"])
        again = compile_program(rewritten)
        assert again == program


def test_ops_without_a_regex_form_are_refused() -> None:
    with pytest.raises(TokenizerMapError, match="metaspace_split"):
        program_pattern([{"op": "metaspace_split", "prefix_first": False}])
    with pytest.raises(TokenizerMapError, match="no ops"):
        program_pattern([])


def test_split_alternation_respects_groups_classes_and_escapes() -> None:
    assert split_alternation(r"a|(b|c)|[|]|\||[]|]|[^]|x]") == [
        "a",
        "(b|c)",
        "[|]",
        r"\|",
        "[]|]",
        "[^]|x]",
    ]


def split_by_regex(pattern: str, text: str) -> list[str]:
    splitter = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return [piece for piece, _ in splitter.pre_tokenize_str(text)]


@pytest.mark.parametrize("name", FITTING)
def test_program_cuts_probe_strings_like_the_pattern(name: str) -> None:
    pattern = FITTING[name]
    program = compile_program(pattern)
    assert program is not None
    ops = program.to_json()["ops"]
    differ = [
        text for text in PROBE_STRINGS if run_program(ops, text) != split_by_regex(pattern, text)
    ]
    assert differ == []


@pytest.mark.parametrize("pattern", [HF_LLAMA3_PATTERN, HF_QWEN2_PATTERN])
def test_unicode_case_folding_is_the_one_known_difference(pattern: str) -> None:
    # Oniguruma's (?i) folds U+017F (long s) to "s", op set v1's literals_ci folds ASCII only:
    # "'ſ" followed by letters is a contraction to the regex and part of a word to the program.
    program = compile_program(pattern)
    assert program is not None
    ops = program.to_json()["ops"]
    assert split_by_regex(pattern, "x'\u017ft") == ["x", "'\u017f", "t"]
    assert run_program(ops, "x'\u017ft") == ["x", "'\u017ft"]
    assert run_program(ops, "x'St") == split_by_regex(pattern, "x'St") == ["x", "'S", "t"]


TEXT = st.text(
    alphabet=st.sampled_from(list("aZé日1٣ ²'sStTrReE\n\r\t.,!-\u00a0\u3000🎉_")),
    max_size=40,
)


@given(TEXT)
def test_program_matches_the_pattern_on_generated_text(text: str) -> None:
    for pattern in (LLAMA3_PATTERN, QWEN2_PATTERN):
        program = compile_program(pattern)
        assert program is not None
        assert run_program(program.to_json()["ops"], text) == split_by_regex(pattern, text)
