"""Load a Codec tokenizer map (schema v2: `vocab` + `merges`) as a `tokenizers.Tokenizer`.

The map carries the vocabulary, the merges, how bytes become vocabulary strings (`encoder`),
the pre-tokenizer regex (or its op program) and the control tokens; the pipeline around them is
rebuilt the way the two encoders define it:

* byte_level: the pattern's matches as pre-tokens, GPT-2's byte-to-unicode mapping, BPE;
* metaspace: SentencePiece BPE as Llama-2 and Mistral convert it: prepend "▁", spaces become
  "▁", no splitting, byte fallback over the `<0x00>`..`<0xFF>` range.

Two facts the schema has no field for are inferred, both exact for every family we test (see
docs/TOKENIZER_MAPS.md):

* Added tokens that are not control tokens (Qwen's `<think>`, GGUF USER_DEFINED tokens) are the
  vocabulary entries BPE cannot build: neither one symbol, nor the result of a merge, nor a byte
  token. They are matched whole in text, as their source tokenizers match them.
* BPE looks a whole pre-token up before merging (`ignore_merges`), as tiktoken and Llama-3 do.
  For every other tested family this changes no id, because their merges reach every token.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from proxy.core.maps.checks import map_problems
from proxy.core.maps.content import METASPACE
from proxy.core.maps.pretok_program import program_pattern
from proxy.maps.schema import schema_problems
from proxy.tokenizers.errors import TokenizerLoadError, one_line
from proxy.tokenizers.from_hf import EOS_TOKEN_NAMES
from proxy.tokenizers.loaded import Encoder, LoadedTokenizer
from proxy.tokenizers.source import JsonSource

UNKNOWN_TOKEN = "<unk>"


def looks_like_codec_map(document: Mapping[str, Any]) -> bool:
    """A map has `vocab_size` and `vocab` (or v1 `tokens`), and no tokenizer.json `model`."""
    return (
        "vocab_size" in document
        and ("vocab" in document or "tokens" in document)
        and ("model" not in document)
    )


def _problems(document: Mapping[str, Any]) -> list[str]:
    problems = schema_problems(document)
    return problems or map_problems(document)


def _whole_tokens(document: Mapping[str, Any], special_ids: set[int]) -> list[str]:
    """Non-special added tokens: vocabulary entries that are neither a merge's result nor a
    base symbol (SentencePiece starts from characters, with byte tokens as the fallback)."""
    built = {merge.replace(" ", "", 1) for merge in document["merges"]}
    start = document.get("byte_fallback_start", -1)
    end = document.get("byte_fallback_end", -2)
    # A base symbol: one of the 256 byte characters, or (metaspace) any one character.
    alphabet = (
        frozenset(pre_tokenizers.ByteLevel.alphabet())
        if document["encoder"] == "byte_level"
        else None
    )

    def is_base(token: str) -> bool:
        return token in alphabet if alphabet is not None else len(token) == 1

    return [
        token
        for token, index in document["vocab"].items()
        if not is_base(token)
        and token not in built
        and index not in special_ids
        and not start <= index <= end
    ]


def _pipeline(
    document: Mapping[str, Any], vocab: dict[str, int], merges: list[tuple[str, str]]
) -> Tokenizer:
    if document["encoder"] == "byte_level":
        pattern = document.get("pre_tokenizer_pattern") or program_pattern(
            document["pre_tokenizer_program"]["ops"]
        )
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer
    byte_fallback = "byte_fallback_start" in document
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=UNKNOWN_TOKEN if UNKNOWN_TOKEN in vocab else None,
            fuse_unk=True,
            byte_fallback=byte_fallback,
            ignore_merges=True,
        )
    )
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend(METASPACE), normalizers.Replace(" ", METASPACE)]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(METASPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tokenizer


def tokenizer_from_map(document: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer a valid v2 map with an encoder and merges describes."""
    vocab: dict[str, int] = dict(document["vocab"])
    merges = [(left, right) for left, _, right in (m.partition(" ") for m in document["merges"])]
    tokenizer = _pipeline(document, vocab, merges)
    text_of = {index: token for token, index in vocab.items()}
    special_ids = set(document.get("special_tokens", {}).values())
    # The control tokens by their text (a map may name them by role, e.g. "eos"), in id order.
    tokenizer.add_special_tokens(
        [
            AddedToken(text_of[index], special=True, normalized=False)
            for index in sorted(special_ids)
            if index in text_of
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token in _whole_tokens(document, special_ids)
        ]
    )
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_codec_map(source: JsonSource) -> LoadedTokenizer | None:
    """Load `source` if it is a Codec tokenizer map, else return None."""
    document = source.document
    if not looks_like_codec_map(document):
        return None
    problems = _problems(document)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TokenizerLoadError(
            f"{source.path}: not a valid Codec tokenizer map: {problems[0]}{more}"
        )
    if "vocab" not in document:
        raise TokenizerLoadError(f"{source.path}: a v1 map ('tokens') cannot tokenize text")
    encoder: Encoder | None = document.get("encoder")
    if encoder is None or not document.get("merges"):
        raise TokenizerLoadError(
            f"{source.path}: a map without 'encoder' and 'merges' (identity map) cannot "
            "tokenize text as a BPE backend does"
        )
    try:
        tokenizer = tokenizer_from_map(document)
    except Exception as exc:  # tokenizers raises bare Exceptions for inconsistent models
        raise TokenizerLoadError(
            f"{source.path}: map does not build a tokenizer: {one_line(exc)}"
        ) from exc
    special = MappingProxyType(dict(document.get("special_tokens", {})))
    text_of = {index: token for token, index in document["vocab"].items()}
    eos = sorted(
        index
        for name, index in special.items()
        if name in EOS_TOKEN_NAMES or text_of.get(index) in EOS_TOKEN_NAMES
    )
    return LoadedTokenizer(
        tokenizer=tokenizer,
        source=source.path,
        source_kind="codec-map",
        encoder=encoder,
        vocab_size=document["vocab_size"],
        pre_type=None,
        special_tokens=special,
        eos_token_ids=tuple(dict.fromkeys(eos)),
        # A map states when it was published; the file's own mtime would change its bytes.
        published_at=document.get("published_at", source.published_at),
        map_id=document["id"],
    )
