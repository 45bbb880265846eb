"""The retokenizer's invariant, for any split of any text into deltas:

    concat(feed(delta) for delta in deltas) + flush() == scheme.encode_exactly(text)

which is `tokenizer.encode(text)` wherever those IDs render the text, and IDs that render exactly
the text everywhere (spelled in byte tokens where the tokenizer would normalize it), or an error
where the vocabulary cannot spell it. Checked against real tokenizer files of every family we
support, with hypothesis-generated texts and splits, and at every split point of fixed texts
that exercise the known traps.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from proxy import assets
from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme
from proxy.tokenizers import load_tokenizer


@dataclass(frozen=True)
class Family:
    name: str
    reference: Tokenizer
    scheme: RetokenizerScheme
    normalize: Callable[[str], str]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.reference.encode(text, add_special_tokens=False).ids
        return ids

    def exact(self, text: str) -> list[int]:
        return self.scheme.encode_exactly(text, at_start=True)

    def renders(self, ids: list[int], text: str) -> bool:
        """The IDs' bytes are the text's, after what the tokenizer adds at a text's start."""
        prefix = self.scheme.prefix if text else b""
        return self.scheme.token_bytes.joined(ids) == prefix + text.encode()


def _family(name: str, path: Path, normalize: Callable[[str], str]) -> Family:
    loaded = load_tokenizer(path)
    scheme = RetokenizerScheme.from_tokenizer(loaded.tokenizer, loaded.encoder)
    return Family(name, loaded.tokenizer, scheme, normalize)


def _identity(text: str) -> str:
    return text


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _metaspace(text: str) -> str:
    # SentencePiece stores a space as "▁", so a literal "▁" in the text decodes as a space.
    return text.replace("▁", " ")


def _vocab(name: str) -> Path:
    return assets.llamacpp_vocab_dir() / f"ggml-vocab-{name}.gguf"


# Real tokenizer files of every supported family: byte-level BPE with each GGUF pre-tokenizer
# type (SmolLM2's own GGUF, GPT-2, Llama-3, Qwen2), Hugging Face tokenizer.json files (Llama-3,
# Qwen3 with its NFC normalizer and added tokens), and SentencePiece/metaspace (Mistral-7B).
FAMILY_LOADERS: dict[str, Callable[[], Family]] = {
    "smollm2-gguf": lambda: _family("smollm2", assets.SMOLLM2_GGUF.ensure(), _identity),
    "gpt2-gguf": lambda: _family("gpt2", _vocab("gpt-2"), _identity),
    "llama3-gguf": lambda: _family("llama3-gguf", _vocab("llama-bpe"), _identity),
    "qwen2-gguf": lambda: _family("qwen2-gguf", _vocab("qwen2"), _identity),
    "llama3-json": lambda: _family("llama3", assets.LLAMA3_TOKENIZER.ensure(), _identity),
    "qwen3-json": lambda: _family("qwen3", assets.QWEN3_TOKENIZER.ensure(), _nfc),
    "mistral-json": lambda: _family("mistral", assets.MISTRAL_TOKENIZER.ensure(), _metaspace),
}
_cache: dict[str, Family] = {}


def load_family(name: str) -> Family:
    if name not in _cache:
        _cache[name] = FAMILY_LOADERS[name]()
    return _cache[name]


@pytest.fixture(params=sorted(FAMILY_LOADERS), scope="module")
def family(request: pytest.FixtureRequest) -> Family:
    return load_family(request.param)


def stream(scheme: RetokenizerScheme, deltas: list[str]) -> list[int]:
    retokenizer = Retokenizer(scheme)
    ids: list[int] = []
    for delta in deltas:
        ids += retokenizer.feed(delta)
    return ids + retokenizer.flush()


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(max(c, 0), len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# Fragments that hit the known traps: whitespace runs regrouping, contractions, Llama-3's
# punctuation+newline pieces, digit grouping, multi-codepoint emoji, combining marks (NFC),
# special and added token strings inside text, long words, CJK runs.
TRAPS = [
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "\n \n",
    ".\n",
    "!\n\n",
    "'",
    "'s",
    "'re",
    "'ll",
    "'ve",
    "'d",
    "it",
    "don",
    "we",
    "re",
    "ll",
    "Hello",
    "world",
    " the",
    "aaaaaaaaaaaaaaaaaaaaaa",
    "x",
    "1",
    "12",
    "123",
    "1234",
    "2026-11-29",
    "3.14159",
    "1,000,000",
    "世界",
    "你好，",
    "こんにちは。",
    "한국어",
    "\u1100",
    "\u1161",
    "\u0958",
    "\u2126",
    "\u212b",
    "\u0344",
    "\u1e9b\u0323",  # NFC expands or reorders these
    "🎉",
    "👨\u200d👩\u200d👧",
    "🇫🇷",
    "é",
    "e\u0301",
    "\u0301",
    "ñ",
    "Ω",
    "ß",
    "ﬁ",
    "ı",
    ",",
    ".",
    "!",
    "?",
    "...",
    "->",
    "==",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ":",
    ";",
    '"',
    "def f(x):",
    "    return x",
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<",
    "|",
    ">",
    "▁",
    "Ġ",
    "\u00a0",
    "\u200b",
    "\u3000",
]

# Assigned, printable characters (control characters come from TRAPS): a byte-level vocabulary
# may lack the bytes of C0 controls and of unassigned planes (SmolLM2 has no token for 0x16 or
# 0xF1), and such text cannot round-trip through the tokenizer at all.
characters = st.characters(exclude_categories=("Cs", "Co", "Cn", "Cc"))
texts = st.one_of(
    st.lists(st.one_of(st.sampled_from(TRAPS), st.text(characters, max_size=4)), max_size=48).map(
        "".join
    ),
    st.text(characters, max_size=80),
)


@given(data=st.data())
def test_any_split_gives_whole_text_encoding(family: Family, data: st.DataObject) -> None:
    text = data.draw(texts, label="text")
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)), label="cuts")
    ids = stream(family.scheme, split_at(text, cuts))
    assert ids == family.exact(text)
    assert family.renders(ids, text)
    if family.normalize(text) == text:  # the tokenizer's own IDs render it: they are kept
        assert ids == family.encode(text)
        assert family.reference.decode(ids, skip_special_tokens=False) == text


@given(text=texts)
def test_one_character_at_a_time(family: Family, text: str) -> None:
    assert stream(family.scheme, list(text)) == family.exact(text)


FIXED = [
    "Hello world  it's 12345 ok.\n\n x",
    "We're here, aren't we? I'll say: 'yes'.\n\n\n  Indented\ttabs\r\nCRLF",
    "def add(a, b):\n    return a + b  # sum\n\n\nprint(add(1, 2))\n",
    "价格是 1234.56 元，对吗？日本語も。🎉🎉 👨\u200d👩\u200d👧 done",
    "special <|im_end|> and <think>reasoning</think> and <tool_call>{}</tool_call>",
    "cafe\u0301 na\u00efve co\u00f6perate \u00a0nbsp",
    "a  </think>  <think>\n\n</think>x <tool_call>  y",
    # What a normalizer changes: decomposed accents, singletons, a composition exclusion,
    # a reordering; SentencePiece's "▁" as text, alone, doubled and beside spaces.
    "Cafe\u0301 \u212b\u2126 x\u0344y e\u0323\u0307 \u0958 \u1e9b\u0323 A\u030a.",
    "\u2581 a\u2581b \u2581\u2581 x \u2581  y\u2581\n\u2581",
    # A mark that comes later reorders with one before it and composes with the letter before
    # both: `U U+0305` then U+031B is `Ư U+0305`; so does a Hangul final jamo with a syllable.
    "AU\u0305\u031b x\u0305\u0323 \uac00\u11a8 \u1100\u1161\u11a8.",
]


@pytest.mark.parametrize("text", FIXED)
def test_every_split_point(family: Family, text: str) -> None:
    expected = family.exact(text)
    assert family.renders(expected, text)
    if family.normalize(text) == text:
        assert expected == family.encode(text)
    for cut in range(len(text) + 1):
        assert stream(family.scheme, [text[:cut], text[cut:]]) == expected, cut
    for a in range(0, len(text), 3):
        for b in range(a, len(text), 5):
            assert stream(family.scheme, [text[:a], text[a:b], text[b:]]) == expected, (a, b)


def test_emits_before_the_end(family: Family) -> None:
    # Streaming, not buffering: most IDs are out before flush().
    words = ("The quick brown fox jumps over the lazy dog. " * 20).split(" ")
    retokenizer = Retokenizer(family.scheme)
    early = [i for word in words for i in retokenizer.feed(word + " ")]
    late = retokenizer.flush()
    assert len(early) > 10 * len(late)


def test_work_is_linear_in_the_text(family: Family) -> None:
    # A 20k-character word with no cut point must not be re-encoded on every delta.
    calls = 0

    class Counting(Retokenizer):
        def _commit(self) -> list[int]:
            nonlocal calls
            calls += 1
            return super()._commit()

    retokenizer = Counting(family.scheme)
    for _ in range(5000):
        retokenizer.feed("abcd")
    assert calls < 60
    assert retokenizer.flush() == family.encode("abcd" * 5000)


# --- text the tokenizer would give back otherwise: spelled in byte tokens --------------------

# Normalization traps, SentencePiece's "▁", and characters some vocabularies lack bytes for.
SPELLING_TRAPS = [
    "e\u0301",
    "a\u0308\u0301",
    "\u0301",
    "\u212b",
    "\u2126",
    "\u0958",
    "\u0344",
    "\u1e9b\u0323",
    "\u2581",
    "\u2581\u2581",
    " \u2581",
    "\u2581 ",
    "\ufb01",
    "\uff21",
]
marks = st.characters(min_codepoint=0x300, max_codepoint=0x36F)  # combining diacritics
trap_texts = st.lists(
    st.one_of(st.sampled_from(SPELLING_TRAPS + TRAPS), marks, st.text(characters, max_size=3)),
    max_size=24,
).map("".join)


@given(data=st.data())
def test_ids_render_exactly_the_text_whatever_it_is(family: Family, data: st.DataObject) -> None:
    text = data.draw(trap_texts, label="text")
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)), label="cuts")
    ids = stream(family.scheme, split_at(text, cuts))
    assert family.renders(ids, text)
    assert ids == family.exact(text)


@given(text=trap_texts)
def test_ids_are_checked_whenever_the_text_may_come_back_otherwise(
    family: Family, text: str
) -> None:
    # The quick check lets IDs out unchecked: only for text they surely render.
    scheme = family.scheme
    unchecked = (
        scheme.unsure is not None
        and scheme.unsure.search(text) is None
        and (not scheme.nfc or unicodedata.is_normalized("NFC", text))
    )
    if unchecked:
        assert family.renders(family.encode(text), text)


@pytest.mark.parametrize(
    ("name", "text", "spelled"),
    [
        # The tokens a changed character is in are spelled, no more: " café" is one token.
        ("qwen3-json", "Hello cafe\u0301 world", " cafe\u0301"),  # NFC would compose it
        ("qwen3-json", "Hello \u212b world", " \u212b"),  # NFC maps it to U+00C5
        ("mistral-json", "Hello a\u2581b world", "\u2581b"),  # SentencePiece's space mark
    ],
)
def test_only_what_would_change_is_spelled(name: str, text: str, spelled: str) -> None:
    family = load_family(name)
    head, tail = text.split(spelled)
    ids = stream(family.scheme, [text])
    start = family.scheme.encode(head, at_start=True)
    end = family.scheme.encode(tail, at_start=False)
    assert ids[: len(start)] == start
    assert ids[len(ids) - len(end) :] == end
    middle = ids[len(start) : len(ids) - len(end)]
    assert middle == [family.scheme.byte_ids[byte] for byte in spelled.encode()]


@pytest.mark.parametrize(
    ("name", "text"),
    [("smollm2-gguf", "Hi \x16 ok"), ("smollm2-gguf", "a\U00040000"), ("gpt2-gguf", "")],
)
def test_text_the_vocabulary_cannot_spell_is_an_error(name: str, text: str) -> None:
    family = load_family(name)
    if not text:  # a vocabulary with every byte: nothing it cannot spell
        assert None not in family.scheme.byte_ids
        return
    for cut in range(len(text) + 1):
        with pytest.raises(UpstreamProtocolError, match="cannot spell") as caught:
            stream(family.scheme, [text[:cut], text[cut:]])
        assert caught.value.code == "untokenizable_text"


unspellable_texts = st.lists(
    st.one_of(
        st.sampled_from(["\x16", "\x04", "\U00040000", "\U000b0000", "\U000c0000", "\U0010fffd"]),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
).map("".join)


@given(text=unspellable_texts)
def test_the_screen_finds_exactly_what_cannot_be_spelled(family: Family, text: str) -> None:
    # The transcoder stops a text at `spellable_prefix` (its error frame then says why): it
    # must stop at the first character the retokenizer cannot spell, and nowhere else.
    scheme = family.scheme
    prefix = scheme.spellable_prefix(text)
    scheme.encode_exactly(text[:prefix], at_start=True)
    if prefix < len(text):
        with pytest.raises(UpstreamProtocolError, match="cannot spell"):
            scheme.encode_exactly(text[prefix], at_start=False)
