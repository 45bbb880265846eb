"""Helpers shared by the tokenizer tests: llama.cpp's test vectors and tiny GGUF files."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFEndian, GGUFWriter, Keys, TokenType
from tokenizers import pre_tokenizers

from proxy import assets
from proxy.core.maps.content import map_content
from proxy.core.maps.tokenizer_map import MapContent, PublishedMap, render_map
from proxy.tokenizers import LoadedTokenizer, load_tokenizer

# Every real tokenizer source the tests use, by family name. GGUF vocabularies other than
# SmolLM2's are llama.cpp's vocabulary-only test files.
GGUF_VOCAB_FAMILIES = ("gpt-2", "llama-bpe", "qwen2", "starcoder")
JSON_ASSETS = {
    "llama3.json": assets.LLAMA3_TOKENIZER,
    "qwen3.json": assets.QWEN3_TOKENIZER,
    "mistral.json": assets.MISTRAL_TOKENIZER,
}
FAMILIES = (*GGUF_VOCAB_FAMILIES, "smollm2", *JSON_ASSETS)


def family_path(family: str) -> Path:
    """The cached file for one of FAMILIES."""
    if family in JSON_ASSETS:
        return JSON_ASSETS[family].ensure()
    if family == "smollm2":
        return assets.SMOLLM2_GGUF.ensure()
    return assets.llamacpp_vocab_dir() / f"ggml-vocab-{family}.gguf"


class TokenizerCache:
    """`load_tokenizer` memoised for a test session, remembering how long each first load took."""

    def __init__(self) -> None:
        self.loaded: dict[Path, LoadedTokenizer] = {}
        self.seconds: dict[Path, float] = {}

    def __call__(self, path: Path) -> LoadedTokenizer:
        if path not in self.loaded:
            start = time.perf_counter()
            self.loaded[path] = load_tokenizer(path)
            self.seconds[path] = time.perf_counter() - start
        return self.loaded[path]


# llama.cpp's `tests/test-tokenizer-0` format: the .inp file holds the strings, each followed by
# this separator line; the .out file holds one line of space-separated ids per string.
VECTOR_SEPARATOR = "\n__ggml_vocab_test__\n"


def read_vectors(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    """The (text, expected ids) pairs of `ggml-vocab-<name>.gguf.inp/.out`."""
    base = vocab_dir / f"ggml-vocab-{name}.gguf"
    # newline="" keeps "\r\n" in the inputs exactly as written.
    with base.with_suffix(".gguf.inp").open(encoding="utf-8", newline="") as fh:
        inputs = fh.read().split(VECTOR_SEPARATOR)
    with base.with_suffix(".gguf.out").open(encoding="utf-8", newline="") as fh:
        outputs = fh.read().split("\n")
    # Both files end with a terminator, which leaves one empty element after the last entry.
    assert inputs[-1] == "", f"{base}.inp does not end with the separator"
    assert outputs[-1] == "", f"{base}.out does not end with a newline"
    texts, lines = inputs[:-1], outputs[:-1]
    assert len(texts) == len(lines), f"{base}: {len(texts)} inputs, {len(lines)} outputs"
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines, strict=True)]


def byte_level_alphabet() -> list[str]:
    """The 256 printable characters GPT-2's byte-level BPE uses for the 256 byte values."""
    return sorted(pre_tokenizers.ByteLevel.alphabet())


@dataclass(frozen=True)
class TinyVocab:
    """A small but real byte-level BPE vocabulary: every byte, a few merges, added tokens."""

    tokens: list[str] = field(
        default_factory=lambda: [*byte_level_alphabet(), "he", "ll", "hell", "hello", "Ġhello"]
    )
    merges: list[str] = field(default_factory=lambda: ["h e", "l l", "he ll", "hell o", "Ġ hello"])
    control: Sequence[str] = ("<|ctrl|>", "<|eos|>")
    user_defined: Sequence[str] = ("<user>",)

    def all_tokens(self) -> list[str]:
        return [*self.tokens, *self.control, *self.user_defined]

    def token_types(self) -> list[TokenType]:
        return (
            [TokenType.NORMAL] * len(self.tokens)
            + [TokenType.CONTROL] * len(self.control)
            + [TokenType.USER_DEFINED] * len(self.user_defined)
        )


def write_gguf(
    path: Path,
    *,
    model: str | None = "gpt2",
    pre: str | None = "smollm",
    vocab: TinyVocab | None = None,
    eos_id: int | None = None,
    eot_id: int | None = None,
    endianess: GGUFEndian = GGUFEndian.LITTLE,
) -> Path:
    """Write a vocabulary-only GGUF file like llama.cpp's `ggml-vocab-*.gguf`."""
    writer = GGUFWriter(path, arch="llama", endianess=endianess)
    if model is not None:
        writer.add_tokenizer_model(model)
        vocab = vocab or TinyVocab()
        if pre is not None:
            writer.add_tokenizer_pre(pre)
        writer.add_token_list(vocab.all_tokens())
        writer.add_token_types(vocab.token_types())
        writer.add_token_merges(vocab.merges)
        if eos_id is not None:
            writer.add_eos_token_id(eos_id)
        if eot_id is not None:
            writer.add_eot_token_id(eot_id)
    writer.add_string(Keys.General.NAME, "tiny test vocabulary")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# The families whose maps are checked in full: SmolLM2's GGUF and the three tokenizer.json
# files, one per kind of pre-tokenizer (digits then GPT-2, Llama-3, Qwen with NFC, metaspace).
MAP_FAMILIES = ("smollm2", "llama3.json", "qwen3.json", "mistral.json")
GOLDEN_PATH = Path(__file__).resolve().parent.parent / "fixtures" / "tokenizers" / "golden.json"


@dataclass(frozen=True)
class FamilyMap:
    """One family's tokenizer, its map (golden id and published_at) and the map loaded back."""

    loaded: LoadedTokenizer
    content: MapContent
    published: PublishedMap
    path: Path  # the map written to a file
    reloaded: LoadedTokenizer  # load_tokenizer(path)


class MapCache:
    """Maps of MAP_FAMILIES, built on first use in a test session."""

    def __init__(self, load: TokenizerCache, directory: Path) -> None:
        self.golden = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
        self._load = load
        self._directory = directory
        self._maps: dict[str, FamilyMap] = {}

    def __call__(self, family: str) -> FamilyMap:
        if family not in self._maps:
            loaded = self._load(family_path(family))
            content = map_content(
                loaded.tokenizer,
                encoder=loaded.encoder,
                vocab_size=loaded.vocab_size,
                special_tokens=loaded.special_tokens,
                published_at=self.golden["published_at"],
            )
            published = render_map(self.golden["families"][family]["map_id"], content)
            path = self._directory / f"{family}.map.json"
            path.write_bytes(published.body)
            self._maps[family] = FamilyMap(loaded, content, published, path, load_tokenizer(path))
        return self._maps[family]
