"""Read a map's content off a loaded `tokenizers.Tokenizer`, whatever file it came from.

GGUF files, tokenizer.json files and Codec maps all end up as one `tokenizers.Tokenizer`
(`proxy.tokenizers`), so the map is taken from that object's own JSON: the BPE model's vocab
and merges, its added tokens, and its pre-tokenizer. What the map schema cannot say is refused
(`TokenizerMapError`) when it would change the IDs of ordinary text, and reported as a caveat
when it only matters to a client that encodes (a normalizer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from tokenizers import Tokenizer

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.pretok_patterns import (
    GPT2_PATTERN,
    ONE_PATTERN_FOR_STAGES,
    SINGLE_DIGIT_PATTERN,
)
from proxy.core.maps.pretok_program import compile_program
from proxy.core.maps.tokenizer_map import MapContent
from proxy.core.stream.retokenizer import Encoder

METASPACE = "\u2581"
BYTE_TOKENS = tuple(f"<0x{value:02X}>" for value in range(256))


def _state(component: Any) -> Any:
    """A tokenizers component (normalizer, pre-tokenizer, model) as its JSON form."""
    return None if component is None else orjson.loads(component.__getstate__())


def _nodes(node: Any, key: str) -> Iterator[Mapping[str, Any]]:
    """A normalizer or pre-tokenizer and, for a Sequence, its children in order."""
    if not isinstance(node, Mapping):
        return
    if node.get("type") == "Sequence":
        for child in node.get(key, []):
            yield from _nodes(child, key)
    else:
        yield node


def _split_stage(node: Mapping[str, Any]) -> str:
    pattern = node.get("pattern", {})
    if node.get("behavior") != "Isolated" or node.get("invert"):
        raise TokenizerMapError(
            f"pre-tokenizer Split with behavior {node.get('behavior')!r} "
            f"(invert={node.get('invert')}) has no pre_tokenizer_pattern form"
        )
    if "Regex" in pattern:
        return str(pattern["Regex"])
    raise TokenizerMapError(f"pre-tokenizer Split on a plain string {pattern!r} is not supported")


def _byte_level_stages(pre_tokenizer: Any) -> tuple[str, ...]:
    """The isolating regexes a byte-level pre-tokenizer applies, in order."""
    stages: list[str] = []
    byte_level_seen = False
    for node in _nodes(pre_tokenizer, "pretokenizers"):
        kind = node.get("type")
        if byte_level_seen:
            raise TokenizerMapError(f"pre-tokenizer step {kind} after ByteLevel is not supported")
        if kind == "Split":
            stages.append(_split_stage(node))
        elif kind == "Digits":
            stages.append(SINGLE_DIGIT_PATTERN if node.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel":
            byte_level_seen = True
            if node.get("add_prefix_space"):
                raise TokenizerMapError(
                    "ByteLevel(add_prefix_space=true) adds a space the map cannot express"
                )
            if node.get("use_regex", True):
                stages.append(GPT2_PATTERN)
        else:
            raise TokenizerMapError(f"pre-tokenizer {kind} has no Codec map form")
    if not byte_level_seen:
        raise TokenizerMapError("byte-level tokenizer without a ByteLevel pre-tokenizer step")
    if not stages:
        raise TokenizerMapError("byte-level pre-tokenizer without a splitting regex")
    return tuple(stages)


def _one_pattern(stages: tuple[str, ...]) -> str:
    if len(stages) == 1:
        return stages[0]
    if stages in ONE_PATTERN_FOR_STAGES:
        return ONE_PATTERN_FOR_STAGES[stages]
    raise TokenizerMapError(
        f"a sequence of {len(stages)} pre-tokenizer splits has no single pre_tokenizer_pattern "
        f"(supported: one split, or single digits then GPT-2's pattern); splits: {stages!r}"
    )


def _is_sentencepiece_normalizer(normalizer: Any) -> bool:
    """Prepend("▁") then Replace(" " -> "▁"): SentencePiece BPE as Llama-2/Mistral convert."""
    steps = list(_nodes(normalizer, "normalizers"))
    kinds = [(step.get("type"), step.get("prepend"), step.get("content")) for step in steps]
    return (
        len(steps) == 2
        and kinds
        == [
            ("Prepend", METASPACE, None),
            ("Replace", None, METASPACE),
        ]
        and steps[1].get("pattern") == {"String": " "}
    )


def _byte_fallback(model: Mapping[str, Any], vocab: Mapping[str, int]) -> tuple[int, int] | None:
    if not model.get("byte_fallback"):
        return None
    ids = [vocab.get(token) for token in BYTE_TOKENS]
    first = ids[0]
    if first is None or ids != list(range(first, first + 256)):
        raise TokenizerMapError(
            "byte_fallback tokenizer whose <0x00>..<0xFF> tokens are not 256 consecutive ids"
        )
    return first, first + 255


def _merges(model: Mapping[str, Any]) -> list[str]:
    entries = model.get("merges", [])
    # Older tokenizer.json files store "left right" strings, newer ones [left, right] pairs.
    merges = [entry if isinstance(entry, str) else f"{entry[0]} {entry[1]}" for entry in entries]
    for merge in merges:
        if merge.count(" ") != 1 or merge.startswith(" ") or merge.endswith(" "):
            raise TokenizerMapError(
                f"merge {merge!r} does not fit the map's 'left right' form (a part holds a space)"
            )
    return merges


def _vocab(tokenizer: Tokenizer, model: Mapping[str, Any], vocab_size: int) -> dict[str, int]:
    """The model's vocab plus every added token, in id order, as `vocab` wants it."""
    merged = dict(model.get("vocab", {}))
    for index, added in tokenizer.get_added_tokens_decoder().items():
        merged[added.content] = index
    out_of_range = [token for token, index in merged.items() if not 0 <= index < vocab_size]
    if out_of_range:
        raise TokenizerMapError(f"token {out_of_range[0]!r} has an id outside vocab_size")
    return dict(sorted(merged.items(), key=lambda item: item[1]))


def _normalizer_caveats(normalizer: Any) -> tuple[str, ...]:
    kinds = [str(node.get("type")) for node in _nodes(normalizer, "normalizers")]
    if not kinds:
        return ()
    return (
        f"normalizer {'+'.join(kinds)} has no place in a Codec map: a client that encodes with "
        "the map alone gets different ids for text that normalization changes",
    )


def map_content(
    tokenizer: Tokenizer,
    *,
    encoder: Encoder,
    vocab_size: int,
    special_tokens: Mapping[str, int],
    published_at: str | None,
) -> MapContent:
    """The map fields of a BPE tokenizer; TokenizerMapError when it has no faithful map."""
    model = _state(tokenizer.model)
    if model.get("type") != "BPE":
        raise TokenizerMapError(f"only BPE tokenizers have a Codec map, not {model.get('type')}")
    vocab = _vocab(tokenizer, model, vocab_size)
    normalizer = _state(tokenizer.normalizer)
    pre_tokenizer = _state(tokenizer.pre_tokenizer)
    caveats: tuple[str, ...] = ()
    if encoder == "byte_level":
        pattern: str | None = _one_pattern(_byte_level_stages(pre_tokenizer))
        caveats = _normalizer_caveats(normalizer)
    else:
        # SentencePiece BPE has no pattern: a metaspace map means SentencePiece's own pipeline.
        pattern = None
        if pre_tokenizer is not None or not _is_sentencepiece_normalizer(normalizer):
            caveats = (
                "metaspace tokenizer not in SentencePiece's Prepend+Replace form: a client that "
                "encodes with the map alone may treat leading and repeated spaces differently",
            )
    return MapContent(
        vocab_size=vocab_size,
        vocab=vocab,
        encoder=encoder,
        merges=_merges(model),
        pre_tokenizer_pattern=pattern,
        pre_tokenizer_program=None if pattern is None else compile_program(pattern),
        byte_fallback=_byte_fallback(model, vocab),
        special_tokens=dict(sorted(special_tokens.items(), key=lambda item: item[1])),
        published_at=published_at,
        caveats=caveats,
    )
