"""Read a safety policy file (TOML or JSON) at start-up and load it against the model's vocab."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from proxy.core.errors import ConfigError
from proxy.core.safety.policy import SafetyPolicy, load_policy
from proxy.core.safety.rules import Vocab
from proxy.tokenizers import LoadedTokenizer


def read_policy_file(path: Path, tokenizer: LoadedTokenizer) -> SafetyPolicy:
    """The policy in `path` (`.toml` or `.json`); `ConfigError` naming what is wrong.

    Messages name the file and the offending key or rule position, never a rule's content.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read safety policy {path}: {exc}") from exc
    document: Any
    try:
        document = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        # Parser messages quote only a line and column, never the content.
        raise ConfigError(f"safety policy {path} does not parse: {exc}") from exc
    vocab = Vocab(
        size=tokenizer.vocab_size,
        encode=lambda text: tokenizer.tokenizer.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tokenizer.tokenizer.decode(list(ids), skip_special_tokens=False),
    )
    try:
        return load_policy(document, vocab)
    except ConfigError as exc:
        raise ConfigError(f"safety policy {path}: {exc.message}") from exc
