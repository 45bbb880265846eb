"""A new JSON tokenizer format plugs in as one more function in `JSON_LOADERS`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from proxy.tokenizers import LoadedTokenizer, load_tokenizer, loader
from proxy.tokenizers.from_hf import load_tokenizer_json
from proxy.tokenizers.source import JsonSource


def load_example_map(source: JsonSource) -> LoadedTokenizer | None:
    if source.document.get("format") != "example-map":
        return None
    return LoadedTokenizer(
        tokenizer=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")),
        source=source.path,
        source_kind="tokenizer.json",
        encoder="byte_level",
        vocab_size=1,
        pre_type=None,
        special_tokens={},
        eos_token_ids=(),
        published_at=source.published_at,
    )


def test_extra_json_loader_is_consulted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "JSON_LOADERS", (load_tokenizer_json, load_example_map))
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"format": "example-map"}))
    loaded = load_tokenizer(path)
    assert loaded.vocab_size == 1
    assert loaded.source == path
    assert loaded.published_at is not None
