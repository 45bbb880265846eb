"""`load_tokenizer`: one entry point for every tokenizer source the proxy accepts.

A path is resolved to one file (a directory means its tokenizer.json), GGUF files are told apart
by name or magic bytes, and a JSON file is offered to each JSON loader in turn: the first that
recognises the document loads it. Supporting another JSON format means writing one more function
`JsonSource -> LoadedTokenizer | None` and listing it in `JSON_LOADERS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from proxy.tokenizers.errors import TokenizerLoadError
from proxy.tokenizers.from_codec_map import load_codec_map
from proxy.tokenizers.from_gguf import load_gguf
from proxy.tokenizers.from_hf import load_tokenizer_json
from proxy.tokenizers.loaded import LoadedTokenizer
from proxy.tokenizers.source import JsonSource, looks_like_gguf, published_at, read_json, resolve

JsonLoader = Callable[[JsonSource], LoadedTokenizer | None]

# tokenizer.json first: `tokenizers` parses it natively, and only a refusal makes Python parse the
# document, which the Codec map loader needs.
JSON_LOADERS: tuple[JsonLoader, ...] = (load_tokenizer_json, load_codec_map)


def load_tokenizer(path: str | os.PathLike[str]) -> LoadedTokenizer:
    """Load the tokenizer at `path`: a `.gguf` file, a tokenizer.json (or a directory holding
    one), or a Codec tokenizer map.

    Raises TokenizerLoadError with a one-line message naming the file and the problem.
    """
    file = resolve(Path(path))
    stamp = published_at(file)
    if looks_like_gguf(file):
        return load_gguf(file, stamp)
    source = read_json(file, stamp)
    for loader in JSON_LOADERS:
        loaded = loader(source)
        if loaded is not None:
            return loaded
    # Parsing (if no loader has yet) reports a file that is not JSON at all as exactly that.
    keys = ", ".join(sorted(source.document)[:8]) or "none"
    raise TokenizerLoadError(
        f"{file}: JSON is not a tokenizer: neither a Hugging Face tokenizer.json ('model') "
        f"nor a Codec tokenizer map ('vocab_size' and 'vocab') (top-level keys: {keys})"
    )
