"""The one-pattern form of "single digits, then GPT-2's pattern" (SmolLM2, StarCoder) cuts text
exactly as the two stages do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers

from proxy import assets
from proxy.core.maps.pretok_patterns import (
    DIGITS_THEN_GPT2_PATTERN,
    GPT2_PATTERN,
    ONE_PATTERN_FOR_STAGES,
    SINGLE_DIGIT_PATTERN,
)
from proxy.tokenizers.probes import PROBE_STRINGS
from tests.tokenizers.support import read_vectors

TWO_STAGES = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(Regex(SINGLE_DIGIT_PATTERN), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
    ]
)
ONE_STAGE = pre_tokenizers.Split(Regex(DIGITS_THEN_GPT2_PATTERN), behavior="isolated")


def pieces(splitter: pre_tokenizers.PreTokenizer, text: str) -> list[str]:
    return [piece for piece, _ in splitter.pre_tokenize_str(text)]


def test_the_table_names_the_two_stages() -> None:
    assert ONE_PATTERN_FOR_STAGES == {
        (SINGLE_DIGIT_PATTERN, GPT2_PATTERN): DIGITS_THEN_GPT2_PATTERN
    }


def test_whitespace_before_a_digit_stays_one_piece() -> None:
    # The case a plain alternation gets wrong: "a", " ", " ", "1" instead of "a", "  ", "1".
    assert pieces(ONE_STAGE, "a  1") == pieces(TWO_STAGES, "a  1") == ["a", "  ", "1"]


def test_same_pieces_on_probes_and_llamacpp_vectors() -> None:
    vocab_dir = assets.llamacpp_vocab_dir()
    texts = list(PROBE_STRINGS)
    for name in ("gpt-2", "llama-bpe", "qwen2", "starcoder", "llama-spm"):
        texts += [text for text, _ in read_vectors(vocab_dir, name)]
    assert [t for t in texts if pieces(ONE_STAGE, t) != pieces(TWO_STAGES, t)] == []


@given(st.text(alphabet=st.sampled_from(list("ab 1٣²\n\t'sd!.,\u00a0\u3000-é")), max_size=30))
def test_same_pieces_on_generated_text(text: str) -> None:
    assert pieces(ONE_STAGE, text) == pieces(TWO_STAGES, text)
