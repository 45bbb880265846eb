"""Typed application state (aiohttp `AppKey`s) shared by the handlers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from aiohttp import web

from proxy.core.dictionaries import ZstdDictionaries, vocabulary_sha256
from proxy.core.readiness import Readiness
from proxy.core.retokenizer import RetokenizerScheme
from proxy.core.safety.policy import SafetyPolicy
from proxy.core.token_bytes import TokenBytes
from proxy.core.tokenizer_map import MapContent, PublishedMap
from proxy.core.upgrade import VersionPolicy
from proxy.maps.publish import content_of
from proxy.server.lifecycle import Lifecycle
from proxy.server.map_store import MapStore
from proxy.server.metrics import Metrics
from proxy.server.model import ModelResolver
from proxy.server.notices import VersionNotices
from proxy.server.upstream import UpstreamPool
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

    @cached_property
    def map_content(self) -> MapContent:
        """The tokenizer's map fields, read once (seconds for a Llama-3-sized vocabulary)."""
        return content_of(self.loaded)

    @cached_property
    def vocabulary_sha256(self) -> str:
        """Which zstd dictionaries fit this vocabulary (core/dictionaries.py), hashed once."""
        return vocabulary_sha256(self.loaded.tokenizer.get_vocab(True))


SETTINGS = web.AppKey("settings", Settings)
VOCABULARY = web.AppKey("vocabulary", Vocabulary)
UPSTREAM = web.AppKey("upstream", UpstreamPool)
METRICS = web.AppKey("metrics", Metrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
SCHEMA_TEXT = web.AppKey("schema_text", str)
# Loaded zstd dictionaries, at most one per wire format. `.records` are the tokenizer map's
# `zstd_dictionaries[]` entries ({format, url, hash, size_bytes, trained_at?, corpus_summary?}).
ZSTD_DICTIONARIES = web.AppKey("zstd_dictionaries", ZstdDictionaries)
MODEL = web.AppKey("model", ModelResolver)
# Version negotiation and the safety policy (issue 5). SAFETY_POLICY is set only when a policy
# is configured: `app.get(SAFETY_POLICY)` is None otherwise.
VERSION_POLICY = web.AppKey("version_policy", VersionPolicy)
VERSION_NOTICES = web.AppKey("version_notices", VersionNotices)
SAFETY_POLICY = web.AppKey("safety_policy", SafetyPolicy)
TOKENIZER_MAP = web.AppKey("tokenizer_map", PublishedMap)
MAPS = web.AppKey("maps", MapStore)
READINESS = web.AppKey("readiness", Readiness)
