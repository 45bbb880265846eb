"""Find the tokenizer file a configured path means, and read what every loader needs from it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from gguf import GGUF_MAGIC

from proxy.tokenizers.errors import TokenizerLoadError, one_line

TOKENIZER_JSON = "tokenizer.json"
_GGUF_MAGIC_BYTES = GGUF_MAGIC.to_bytes(4, "little")


@dataclass(frozen=True)
class JsonSource:
    """A JSON tokenizer file, read once and offered to each JSON loader in turn.

    `document` is parsed on first use only: parsing an 11 MB tokenizer.json in Python costs a
    third of its load time, and the Hugging Face loader needs the parse only to explain a
    failure.
    """

    path: Path
    text: str
    published_at: str | None

    @cached_property
    def document(self) -> Mapping[str, Any]:
        try:
            document = json.loads(self.text)
        except json.JSONDecodeError as exc:
            raise TokenizerLoadError(f"{self.path}: not valid JSON ({one_line(exc)})") from exc
        if not isinstance(document, dict):
            kind = type(document).__name__
            raise TokenizerLoadError(f"{self.path}: JSON top level is {kind}, not an object")
        return document


def resolve(path: Path) -> Path:
    """The file to load: `path` itself, or the tokenizer.json inside a directory."""
    if path.is_dir():
        candidate = path / TOKENIZER_JSON
        if not candidate.is_file():
            raise TokenizerLoadError(f"{path}: directory has no {TOKENIZER_JSON}")
        return candidate
    if not path.exists():
        raise TokenizerLoadError(f"{path}: no such file or directory")
    return path


def published_at(path: Path) -> str:
    """The file's modification time in UTC, to the second: `2026-11-29T19:32:55Z`."""
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise TokenizerLoadError(f"{path}: cannot read: {one_line(exc)}") from exc
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def looks_like_gguf(path: Path) -> bool:
    """True for a `.gguf` name or GGUF magic bytes; the GGUF reader reports what is wrong."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(4) == _GGUF_MAGIC_BYTES
    except OSError as exc:
        raise TokenizerLoadError(f"{path}: cannot read: {one_line(exc)}") from exc


def read_json(path: Path, stamp: str | None) -> JsonSource:
    """Read a file that should be JSON; parsing waits for the first loader that needs it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerLoadError(
            f"{path}: neither a GGUF file nor UTF-8 JSON (byte {exc.start} is not UTF-8)"
        ) from exc
    except OSError as exc:
        raise TokenizerLoadError(f"{path}: cannot read: {one_line(exc)}") from exc
    return JsonSource(path=path, text=text, published_at=stamp)
