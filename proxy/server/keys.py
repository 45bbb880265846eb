"""Typed application state (aiohttp `AppKey`s) shared by the handlers."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.core.retokenizer import RetokenizerScheme
from proxy.server.lifecycle import Lifecycle
from proxy.server.metrics import Metrics
from proxy.server.upstream import UpstreamPool
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
UPSTREAM = web.AppKey("upstream", UpstreamPool)
METRICS = web.AppKey("metrics", Metrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
SCHEMA_TEXT = web.AppKey("schema_text", str)
