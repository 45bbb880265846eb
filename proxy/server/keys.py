"""Typed application state (aiohttp `AppKey`s) shared by the handlers."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.core.dictionaries import ZstdDictionaries
from proxy.core.retokenizer import RetokenizerScheme
from proxy.server.upstream import Upstream
from proxy.settings import Settings
from proxy.tokenizers import LoadedTokenizer


@dataclass(frozen=True)
class Vocabulary:
    """The model's tokenizer, loaded once, and the retokenizer scheme built from it."""

    loaded: LoadedTokenizer
    scheme: RetokenizerScheme

    @classmethod
    def build(cls, loaded: LoadedTokenizer) -> Vocabulary:
        return cls(loaded, RetokenizerScheme.from_tokenizer(loaded.tokenizer, loaded.encoder))


SETTINGS = web.AppKey("settings", Settings)
VOCABULARY = web.AppKey("vocabulary", Vocabulary)
UPSTREAM = web.AppKey("upstream", Upstream)
SCHEMA_TEXT = web.AppKey("schema_text", str)
# Loaded zstd dictionaries, at most one per wire format. `.records` are the tokenizer map's
# `zstd_dictionaries[]` entries ({format, url, hash, size_bytes, trained_at?, corpus_summary?}).
ZSTD_DICTIONARIES = web.AppKey("zstd_dictionaries", ZstdDictionaries)
