"""decode(encode(text)) gives the text back, for every family, on every probe string.

What holds, per encoder:

* byte-level BPE (GPT-2, Llama-3, Qwen, StarCoder, SmolLM2): exact for any text, because every
  byte has a token. A tokenizer.json with an NFC normalizer (Qwen3) returns the NFC form.
* metaspace (Mistral): exact for text without U+2581 "▁": that character is SentencePiece's
  space marker, so it decodes as a space. (Byte fallback covers everything else. Whole-sequence
  decode only: one token alone loses its leading space, see environment notes.)
"""

from __future__ import annotations

import unicodedata

import pytest

from proxy.tokenizers import LoadedTokenizer
from proxy.tokenizers.probes import PROBE_STRINGS
from tests.tokenizers.support import FAMILIES, TokenizerCache, family_path

# Families whose tokenizer.json normalizes to NFC before anything else.
NFC_FAMILIES = frozenset({"qwen3.json"})


def round_trip(loaded: LoadedTokenizer, text: str) -> str:
    return loaded.tokenizer.decode(loaded.tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(family: str, load_cached: TokenizerCache) -> None:
    loaded = load_cached(family_path(family))
    nfc = family in NFC_FAMILIES
    failures = [
        text
        for text in PROBE_STRINGS
        if round_trip(loaded, text) != (unicodedata.normalize("NFC", text) if nfc else text)
    ]
    assert failures == [], f"{len(failures)}/{len(PROBE_STRINGS)} probes do not round-trip"


def test_metaspace_marker_decodes_as_space(load_cached: TokenizerCache) -> None:
    mistral = load_cached(family_path("mistral.json"))
    assert round_trip(mistral, "a\u2581b") == "a b"
