"""Pre-tokenizer regexes that more than one part of the proxy needs to spell identically."""

from __future__ import annotations

# GPT-2's pattern, which is also the fixed regex inside Hugging Face's `ByteLevel(use_regex=
# True)`. llama.cpp's copy lacks the final `|\s+`, but text no alternative matches stays a piece
# of its own in both implementations, so adding it changes nothing.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Every digit on its own, applied before GPT-2's pattern by StarCoder, Refact and SmolLM (one
# `case` block in llama.cpp). Same split as Hugging Face's `Digits(individual_digits=True)`.
SINGLE_DIGIT_PATTERN = r"\p{N}"

# The two stages above as one alternation, for a map's single `pre_tokenizer_pattern`. Digits
# come first and alone, so GPT-2's ` ?\p{N}+` can never match and is dropped. The one place the
# stages differ from a plain alternation is whitespace in front of a digit: there the first
# stage ends a piece, and GPT-2's `\s+(?!\S)` keeps the whole run together at a piece's end.
# `\s+(?=\p{N})` says exactly that. Equivalence is tested on the probe strings, llama.cpp's
# vectors and generated texts (tests/core/maps/test_pretok_patterns.py).
DIGITS_THEN_GPT2_PATTERN = (
    r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"
)

# Sequences of isolating splits that one alternation reproduces exactly.
ONE_PATTERN_FOR_STAGES: dict[tuple[str, ...], str] = {
    (SINGLE_DIGIT_PATTERN, GPT2_PATTERN): DIGITS_THEN_GPT2_PATTERN,
}
