"""How llama.cpp splits text before BPE, per GGUF `tokenizer.ggml.pre`, as `tokenizers` objects.

llama.cpp does not read a pre-tokenizer from the GGUF: it maps the `tokenizer.ggml.pre` name to
a hard-coded list of regexes (`llm_tokenizer_bpe` in `src/llama-vocab.cpp`) and applies them in
order, each one splitting every piece the previous one produced and keeping both the matches and
the text between them. That is exactly a `Sequence` of `Split(..., behavior="isolated")`, followed
by the GPT-2 byte-to-unicode mapping (`ByteLevel` without its own regex).

The regexes are llama.cpp's, not the Hugging Face originals it cites: llama.cpp rewrote
`(?i:'s|'t|...)` as `(?:'[sS]|'[tT]|...)` because its regex engine has no inline flags.
Oniguruma's Unicode case folding makes the original split `x'ſt` (U+017F) as `x`, `'ſ`, `t`
where llama.cpp splits `x`, `'ſt`; the backend is the ground truth, so we take its form.

Nothing here adds a normalizer: llama.cpp normalizes nothing for these types. Qwen2's
tokenizer.json has NFC, but copying it would change the ids of decomposed text (`e` + U+0301)
away from what the llama.cpp backend produces.

Only names whose rules tests check are listed (llama.cpp's `models/ggml-vocab-*.gguf` test
vectors, or the live server for `smollm`), plus aliases that llama.cpp maps to the very same
pre-tokenizer enum value, and `refact`, which shares StarCoder's `case` block.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

from proxy.core.maps.pretok_patterns import GPT2_PATTERN, SINGLE_DIGIT_PATTERN

# Llama-3's pattern in llama.cpp's case-folding-free form (LLAMA_VOCAB_PRE_TYPE_LLAMA3).
LLAMA3_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2's pattern: Llama-3's with single digits instead of runs of up to three
# (LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


@dataclass(frozen=True)
class PreTokenizerRule:
    """llama.cpp's handling of one family of `tokenizer.ggml.pre` names."""

    patterns: tuple[str, ...]  # applied in order, each isolating its matches
    # llama.cpp looks a whole pre-tokenized word up in the vocabulary before merging when its
    # vocab sets `ignore_merges` (Llama-3); `tokenizers` has the same switch on its BPE model.
    ignore_merges: bool = False

    def build(self) -> pre_tokenizers.PreTokenizer:
        splits: list[pre_tokenizers.PreTokenizer] = [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in self.patterns
        ]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([*splits, byte_level])


_GPT2 = PreTokenizerRule(patterns=(GPT2_PATTERN,))
_LLAMA3 = PreTokenizerRule(patterns=(LLAMA3_PATTERN,), ignore_merges=True)
_QWEN2 = PreTokenizerRule(patterns=(QWEN2_PATTERN,))
_DIGITS_THEN_GPT2 = PreTokenizerRule(patterns=(SINGLE_DIGIT_PATTERN, GPT2_PATTERN))

# `tokenizer.ggml.pre` -> rule. Names sharing one llama.cpp enum value share its code path.
PRE_TOKENIZER_RULES: dict[str, PreTokenizerRule] = {
    "gpt-2": _GPT2,
    "phi-2": _GPT2,  # LLAMA_VOCAB_PRE_TYPE_GPT2
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,  # LLAMA_VOCAB_PRE_TYPE_LLAMA3
    "llama-v3": _LLAMA3,  # LLAMA_VOCAB_PRE_TYPE_LLAMA3
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,  # LLAMA_VOCAB_PRE_TYPE_QWEN2
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
}


def supported_pre_types() -> str:
    """The supported names for error messages, most common first."""
    return ", ".join(PRE_TOKENIZER_RULES)
