"""Load a Hugging Face tokenizer.json as-is: the backend (vLLM) tokenizes with this very file.

Nothing in the pipeline is rebuilt; only `encode_special_tokens` is switched on so that control
tokens written as text are tokenized as text, like the backend's `/tokenize` without special
parsing. What the file does not carry directly (which encoding its pieces use, which ids end a
generation) is read off its structure and, when present, the sibling config files of a model
directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenizers import Tokenizer

from proxy.tokenizers.errors import TokenizerLoadError, one_line
from proxy.tokenizers.loaded import Encoder, LoadedTokenizer
from proxy.tokenizers.source import JsonSource

METASPACE = "\u2581"  # "▁", SentencePiece's visible space

# Special tokens that end a generation in the families we know, for tokenizer.json files that
# come without the model's generation_config.json / tokenizer_config.json.
EOS_TOKEN_NAMES = frozenset(
    {
        "</s>",  # Llama-2, Mistral
        "<|endoftext|>",  # GPT-2, Qwen, SmolLM, StarCoder
        "<|im_end|>",  # ChatML (Qwen, SmolLM2-Instruct)
        "<|end_of_text|>",  # Llama-3 base
        "<|eot_id|>",  # Llama-3 instruct
        "<|eom_id|>",  # Llama-3.1 tool calls
        "<eos>",  # Gemma
        "<end_of_turn>",  # Gemma instruct
        "<|end|>",  # Phi-3
        "<|return|>",  # gpt-oss
        "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
        "<|END_OF_TURN_TOKEN|>",  # Command-R
    }
)


def _walk(node: Any) -> Iterator[Mapping[str, Any]]:
    """A normalizer or pre-tokenizer node and every node nested in it by a Sequence."""
    if not isinstance(node, Mapping):
        return
    yield node
    for key in ("normalizers", "pretokenizers"):
        children = node.get(key)
        if isinstance(children, list):
            for child in children:
                yield from _walk(child)


def _is_space_to_metaspace(node: Mapping[str, Any]) -> bool:
    pattern = node.get("pattern")
    return (
        node.get("type") == "Replace"
        and isinstance(pattern, Mapping)
        and pattern.get("String") == " "
        and node.get("content") == METASPACE
    )


def detect_encoder(document: Mapping[str, Any]) -> Encoder:
    """`metaspace` for SentencePiece-style files (spaces become "▁"), else `byte_level`.

    Metaspace shows as a Metaspace pre-tokenizer (Llama-2 as converted by transformers), a
    Replace(" " -> "▁") normalizer (Mistral, Gemma), or a byte-fallback BPE without any
    ByteLevel step. GPT-2-style files map bytes to printable characters with ByteLevel instead.
    """
    stages = [*_walk(document.get("normalizer")), *_walk(document.get("pre_tokenizer"))]
    if any(node.get("type") == "Metaspace" or _is_space_to_metaspace(node) for node in stages):
        return "metaspace"
    model = document.get("model")
    byte_fallback = isinstance(model, Mapping) and model.get("byte_fallback") is True
    if byte_fallback and not any(node.get("type") == "ByteLevel" for node in stages):
        return "metaspace"
    return "byte_level"


def _read_sibling(path: Path) -> Mapping[str, Any] | None:
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"{path}: unreadable model config: {one_line(exc)}") from exc
    return document if isinstance(document, Mapping) else None


def _configured_eos(directory: Path, vocab: Mapping[str, int]) -> list[int]:
    """EOS ids a model directory declares: generation_config.json, then tokenizer_config.json.

    vLLM stops on generation_config.json's `eos_token_id` (an id or a list of ids), and the
    tokenizer's own `eos_token` names one more.
    """
    ids: list[int] = []
    generation = _read_sibling(directory / "generation_config.json")
    if generation is not None:
        declared = generation.get("eos_token_id")
        for value in declared if isinstance(declared, list) else [declared]:
            if isinstance(value, int) and not isinstance(value, bool):
                ids.append(value)
    tokenizer_config = _read_sibling(directory / "tokenizer_config.json")
    if tokenizer_config is not None:
        eos = tokenizer_config.get("eos_token")
        name = eos.get("content") if isinstance(eos, Mapping) else eos
        if isinstance(name, str) and name in vocab:
            ids.append(vocab[name])
    return list(dict.fromkeys(ids))


def _pipeline(tokenizer: Tokenizer) -> dict[str, Any]:
    """The parts of the loaded pipeline `detect_encoder` reads, in tokenizer.json's shape."""
    return {
        "normalizer": json.loads(tokenizer.normalizer.__getstate__())
        if tokenizer.normalizer
        else None,
        "pre_tokenizer": json.loads(tokenizer.pre_tokenizer.__getstate__())
        if tokenizer.pre_tokenizer
        else None,
        "model": {"byte_fallback": getattr(tokenizer.model, "byte_fallback", False)},
    }


def load_tokenizer_json(source: JsonSource) -> LoadedTokenizer | None:
    """Load `source` if it is a Hugging Face tokenizer.json, else return None.

    `tokenizers` parses the file itself; only when it refuses do we look inside: a document
    with a `model` object was meant to be a tokenizer.json and its error is reported, anything
    else is left to the next loader.
    """
    try:
        tokenizer = Tokenizer.from_str(source.text)
    except Exception as exc:  # tokenizers raises a bare Exception for any invalid file
        if not isinstance(source.document.get("model"), Mapping):
            return None
        raise TokenizerLoadError(
            f"{source.path}: not a loadable tokenizer.json: {one_line(exc)}"
        ) from exc
    tokenizer.encode_special_tokens = True
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    special = {
        added.content: index
        for index, added in sorted(tokenizer.get_added_tokens_decoder().items())
        if added.special
    }
    eos_ids = _configured_eos(source.path.parent, vocab) or sorted(
        index for name, index in special.items() if name in EOS_TOKEN_NAMES
    )
    return LoadedTokenizer(
        tokenizer=tokenizer,
        source=source.path,
        source_kind="tokenizer.json",
        encoder=detect_encoder(_pipeline(tokenizer)),
        vocab_size=max(vocab.values(), default=-1) + 1,
        pre_type=None,
        special_tokens=MappingProxyType(special),
        eos_token_ids=tuple(eos_ids),
        published_at=source.published_at,
    )
