"""Typed application state (aiohttp `AppKey`s) shared by the handlers."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.core.retokenizer import RetokenizerScheme
from proxy.core.token_bytes import TokenBytes
from proxy.server.model import ModelResolver
from proxy.server.upstream import Upstream
from proxy.settings import Settings
from proxy.tokenizers import LoadedTokenizer


@dataclass(frozen=True)
class Vocabulary:
    """The model's tokenizer, loaded once, and what streams derive from it."""

    loaded: LoadedTokenizer
    scheme: RetokenizerScheme
    # Each ID's bytes, to check backend-reported IDs against the text (core/backend_ids.py).
    token_bytes: TokenBytes

    @classmethod
    def build(cls, loaded: LoadedTokenizer) -> Vocabulary:
        return cls(
            loaded,
            RetokenizerScheme.from_tokenizer(loaded.tokenizer, loaded.encoder),
            TokenBytes.from_tokenizer(loaded.tokenizer, loaded.encoder),
        )


SETTINGS = web.AppKey("settings", Settings)
VOCABULARY = web.AppKey("vocabulary", Vocabulary)
UPSTREAM = web.AppKey("upstream", Upstream)
SCHEMA_TEXT = web.AppKey("schema_text", str)
MODEL = web.AppKey("model", ModelResolver)
