"""Build a `tokenizers.Tokenizer` from a GGUF file's metadata, the way llama.cpp tokenizes.

Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`) are converted. The GGUF
carries the tokens, their types and the merges; how text is split before BPE is not in the file
but implied by `tokenizer.ggml.pre` (see `pretokenizers.py`).

Token types decide how a token's text is matched in input, mirroring llama.cpp's
`tokenizer_st_partition` with `parse_special=false`:

* CONTROL (`<|im_start|>`) is never matched as a whole in plain text: a special added token with
  `encode_special_tokens` on.
* USER_DEFINED is matched in text even without `parse_special`: a non-special added token.
* Everything else is an ordinary vocabulary entry reached through the merges.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from gguf import Keys, TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models

from proxy.tokenizers.errors import TokenizerLoadError, one_line
from proxy.tokenizers.gguf_metadata import GgufMetadata, GgufValue, read_gguf_metadata
from proxy.tokenizers.loaded import LoadedTokenizer
from proxy.tokenizers.pretokenizers import PRE_TOKENIZER_RULES, supported_pre_types

_K = Keys.Tokenizer
# The end-of-generation ids a GGUF declares, in the order the proxy reports them.
_EOS_KEYS = (_K.EOS_ID, _K.EOT_ID, _K.EOM_ID)
_WANTED_KEYS = frozenset({_K.MODEL, _K.PRE, _K.LIST, _K.TOKEN_TYPE, _K.MERGES, *_EOS_KEYS})

# What the other `tokenizer.ggml.model` values are, for a useful refusal.
_OTHER_MODELS = {
    "llama": "SentencePiece",
    "t5": "SentencePiece Unigram",
    "bert": "WordPiece",
    "rwkv": "RWKV",
    "plamo2": "PLaMo-2",
}


def _fail(path: Path, problem: str) -> TokenizerLoadError:
    return TokenizerLoadError(f"{path}: {problem}")


def _string(meta: GgufMetadata, key: str) -> str | None:
    value = meta.values.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _fail(meta.path, f"{key} is not a string")


def _string_list(meta: GgufMetadata, key: str) -> list[str]:
    value = meta.values.get(key)
    if value is None:
        raise _fail(meta.path, f"no {key} in the GGUF metadata")
    if not isinstance(value, list) or (value and not isinstance(value[0], str)):
        raise _fail(meta.path, f"{key} is not an array of strings")
    return cast("list[str]", value)  # the reader builds string arrays only from str items


def _int_array(meta: GgufMetadata, key: str, length: int) -> npt.NDArray[Any]:
    value = meta.values.get(key)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        raise _fail(meta.path, f"{key} is missing or not an integer array")
    if len(value) != length:
        raise _fail(meta.path, f"{key} has {len(value)} entries for {length} tokens")
    return value


def _token_id(value: GgufValue | None, vocab_size: int) -> int | None:
    # A GGUF writer that has no such token stores -1 (or its u32 wrap) or leaves the key out.
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < vocab_size else None


def _split_merges(path: Path, merges: Sequence[str]) -> list[tuple[str, str]]:
    # llama.cpp splits at the first space after the first character, so a left part that
    # starts with a space (impossible in byte-level text, where a space is "Ġ") stays whole.
    pairs: list[tuple[str, str]] = []
    append = pairs.append
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            raise _fail(path, f"merge {merge!r} has no space between its two parts")
        append((merge[:cut], merge[cut + 1 :]))
    return pairs


def _build(
    path: Path, tokens: list[str], types: npt.NDArray[Any], merges: list[str], pre: str
) -> Tokenizer:
    rule = PRE_TOKENIZER_RULES[pre]
    # Duplicate token texts keep their last id, as llama.cpp's `token_to_id` map does.
    vocab = {text: index for index, text in enumerate(tokens)}
    pairs = _split_merges(path, merges)
    try:
        model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=rule.ignore_merges)
    except BaseException as exc:
        # A merge part that is not a token is a bare Exception; a merge result that is not a
        # token panics in Rust, which pyo3 raises as PanicException, a BaseException. Checking
        # the merges in Python first would double the load time, so translate just these two.
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise _fail(path, f"inconsistent BPE vocabulary: {one_line(exc)}") from exc
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = rule.build()
    tokenizer.decoder = decoders.ByteLevel()
    control = np.flatnonzero(types == TokenType.CONTROL)
    user_defined = np.flatnonzero(types == TokenType.USER_DEFINED)
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in control]
    )
    tokenizer.add_tokens(
        [AddedToken(tokens[i], special=False, normalized=False) for i in user_defined]
    )
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_gguf(path: Path, published_at: str | None) -> LoadedTokenizer:
    """Load the byte-level BPE tokenizer embedded in the GGUF file at `path`."""
    meta = read_gguf_metadata(path, _WANTED_KEYS)
    model = _string(meta, _K.MODEL)
    if model is None:
        raise _fail(path, f"GGUF has no tokenizer metadata ({_K.MODEL} is missing)")
    if model != "gpt2":
        kind = _OTHER_MODELS.get(model, "not byte-level BPE")
        raise _fail(
            path,
            f"unsupported GGUF tokenizer model {model!r} ({kind}); "
            "only 'gpt2' (byte-level BPE) is supported",
        )
    pre = _string(meta, _K.PRE)
    if pre is None:
        raise _fail(path, f"GGUF has no {_K.PRE}; supported: {supported_pre_types()}")
    if pre not in PRE_TOKENIZER_RULES:
        raise _fail(
            path,
            f"unsupported GGUF pre-tokenizer type {pre!r} (supported: {supported_pre_types()})",
        )
    tokens = _string_list(meta, _K.LIST)
    types = _int_array(meta, _K.TOKEN_TYPE, len(tokens))
    merges = _string_list(meta, _K.MERGES)
    tokenizer = _build(path, tokens, types, merges, pre)
    vocab_size = len(tokens)
    special = {tokens[i]: int(i) for i in np.flatnonzero(types == TokenType.CONTROL)}
    eos_ids = (_token_id(meta.values.get(key), vocab_size) for key in _EOS_KEYS)
    return LoadedTokenizer(
        tokenizer=tokenizer,
        source=path,
        source_kind="gguf",
        encoder="byte_level",
        vocab_size=vocab_size,
        pre_type=pre,
        special_tokens=MappingProxyType(special),
        eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),
        published_at=published_at,
    )
