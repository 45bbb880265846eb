"""The public safety-policy descriptor: validation, canonical bytes, sha256.

Field facts follow the Codec repo's `spec/safety-policy.schema.json` (v1): `id`, `version`,
`tokenizers`, `categories` and `classifier` are required; no other top-level key is allowed;
category names match `[a-z0-9_-]+`; actions are `stop|redact|regenerate|flag`; the classifier
`host` is `server|client|both`.

Canonical bytes (codec-spec.md §7, "Safety-policy descriptors do have a canonical form"):
2-space indented JSON, UTF-8 (no ASCII escaping), a trailing newline, absent fields omitted,
keys in the fixed schema order (not sorted). Clients hash the raw bytes they fetch, so the
proxy serves exactly these bytes and advertises their sha256.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime
from typing import Any

from proxy.core.errors import ConfigError

ACTIONS = ("stop", "redact", "regenerate", "flag")
CLASSIFIER_HOSTS = ("server", "client", "both")
ENGINE_FEATURES = ("logits_processor", "hidden_states", "sampling_chain")
DESCRIPTOR_VERSION = "1"

_CATEGORY_NAME = re.compile(r"[a-z0-9_-]+")
# Well-known IDs (WKD): lowercase, `/` separates path segments, no traversal.
_POLICY_ID = re.compile(r"[a-z0-9._/-]+")


@dataclass(frozen=True, slots=True)
class Category:
    name: str
    action: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class Classifier:
    family: str
    host: str | None = None
    requires_engine_features: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class RulesSummary:
    banned_token_id_count: int | None = None
    regex_pattern_count: int | None = None
    grammar_constraint_count: int | None = None
    multi_token_pattern_count: int | None = None


@dataclass(frozen=True, slots=True)
class ClientHooks:
    prefilter_categories: tuple[str, ...] | None = None
    client_classifier_family: str | None = None


@dataclass(frozen=True, slots=True)
class Publisher:
    name: str | None = None
    url: str | None = None
    contact: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyDescriptor:
    """The descriptor. Field order here is the canonical key order."""

    id: str
    version: str
    tokenizers: tuple[str, ...]
    categories: tuple[Category, ...]
    classifier: Classifier
    category_registry: str | None = None
    rules_summary: RulesSummary | None = None
    client_hooks: ClientHooks | None = None
    published_at: str | None = None
    publisher: Publisher | None = None

    def category(self, name: str) -> Category | None:
        return next((c for c in self.categories if c.name == name), None)

    def canonical_bytes(self) -> bytes:
        return (json.dumps(_plain(self), indent=2, ensure_ascii=False) + "\n").encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plain(value: Any) -> Any:
    """Dataclasses to dicts in field order, tuples to lists, None fields dropped."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for field in fields(value):
            item = getattr(value, field.name)
            if item is not None:
                out[field.name] = _plain(item)
        return out
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


# --- parsing ------------------------------------------------------------------------------


def parse_descriptor(raw: Any) -> PolicyDescriptor:
    """Validate a descriptor document (a parsed TOML/JSON table); `ConfigError` if invalid."""
    doc = _table(raw, "descriptor")
    _only(
        doc,
        "descriptor",
        {f.name for f in fields(PolicyDescriptor)},
    )
    policy_id = _text(doc, "id", "descriptor")
    if not _POLICY_ID.fullmatch(policy_id) or ".." in policy_id or policy_id[0] == "/":
        raise ConfigError(
            "descriptor.id must match [a-z0-9._/-]+ without '..' or a leading '/' "
            "(it is a path under /.well-known/codec/policies/)"
        )
    if policy_id.endswith("/"):
        raise ConfigError("descriptor.id must not end with '/'")
    version = _text(doc, "version", "descriptor")
    if version != DESCRIPTOR_VERSION:
        # The schema: implementations SHOULD reject versions they do not recognize.
        raise ConfigError(f"descriptor.version must be {DESCRIPTOR_VERSION!r}")
    tokenizers = _texts(doc, "tokenizers", "descriptor")
    if not tokenizers:
        raise ConfigError("descriptor.tokenizers must list at least one tokenizer id")
    categories = tuple(_category(item, i) for i, item in enumerate(_list(doc, "categories")))
    if not categories:
        raise ConfigError("descriptor.categories must list at least one category")
    names = [c.name for c in categories]
    if len(set(names)) != len(names):
        raise ConfigError("descriptor.categories has duplicate names")
    published_at = _optional_text(doc, "published_at", "descriptor")
    if published_at is not None:
        _check_timestamp(published_at)
    return PolicyDescriptor(
        id=policy_id,
        version=version,
        tokenizers=tokenizers,
        categories=categories,
        classifier=_classifier(doc.get("classifier")),
        category_registry=_optional_text(doc, "category_registry", "descriptor"),
        rules_summary=_rules_summary(doc.get("rules_summary")),
        client_hooks=_client_hooks(doc.get("client_hooks"), set(names)),
        published_at=published_at,
        publisher=_publisher(doc.get("publisher")),
    )


def _category(raw: Any, index: int) -> Category:
    where = f"descriptor.categories[{index}]"
    item = _table(raw, where)
    _only(item, where, {"name", "action", "description"})
    name = _text(item, "name", where)
    if not _CATEGORY_NAME.fullmatch(name):
        raise ConfigError(f"{where}.name must match [a-z0-9_-]+")
    action = _text(item, "action", where)
    if action not in ACTIONS:
        raise ConfigError(f"{where}.action must be one of {', '.join(ACTIONS)}")
    return Category(name, action, _optional_text(item, "description", where))


def _classifier(raw: Any) -> Classifier:
    where = "descriptor.classifier"
    item = _table(raw, where)
    _only(item, where, {"family", "host", "requires_engine_features"})
    host = _optional_text(item, "host", where)
    if host is not None and host not in CLASSIFIER_HOSTS:
        raise ConfigError(f"{where}.host must be one of {', '.join(CLASSIFIER_HOSTS)}")
    features = None
    if item.get("requires_engine_features") is not None:
        features = _texts(item, "requires_engine_features", where)
        if not set(features) <= set(ENGINE_FEATURES):
            raise ConfigError(
                f"{where}.requires_engine_features entries must be among "
                f"{', '.join(ENGINE_FEATURES)}"
            )
    return Classifier(_text(item, "family", where), host, features)


def _rules_summary(raw: Any) -> RulesSummary | None:
    if raw is None:
        return None
    where = "descriptor.rules_summary"
    item = _table(raw, where)
    names = {f.name for f in fields(RulesSummary)}
    _only(item, where, names)
    counts: dict[str, int] = {}
    for name in names:
        value = item.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            raise ConfigError(f"{where}.{name} must be a non-negative integer")
        counts[name] = value
    return RulesSummary(**counts)


def _client_hooks(raw: Any, categories: set[str]) -> ClientHooks | None:
    if raw is None:
        return None
    where = "descriptor.client_hooks"
    item = _table(raw, where)
    _only(item, where, {"prefilter_categories", "client_classifier_family"})
    prefilter = None
    if item.get("prefilter_categories") is not None:
        prefilter = _texts(item, "prefilter_categories", where)
        if not set(prefilter) <= categories:
            raise ConfigError(f"{where}.prefilter_categories must name declared categories")
    return ClientHooks(prefilter, _optional_text(item, "client_classifier_family", where))


def _publisher(raw: Any) -> Publisher | None:
    if raw is None:
        return None
    where = "descriptor.publisher"
    item = _table(raw, where)
    _only(item, where, {"name", "url", "contact"})
    return Publisher(
        _optional_text(item, "name", where),
        _optional_text(item, "url", where),
        _optional_text(item, "contact", where),
    )


def _check_timestamp(value: str) -> None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError("descriptor.published_at must be an ISO 8601 date-time") from exc
    if parsed.tzinfo is None:
        raise ConfigError("descriptor.published_at must carry a time zone (e.g. a trailing Z)")


# --- small typed readers ------------------------------------------------------------------


def _table(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table")
    return raw


def _only(table: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s): {', '.join(unknown)}")


def _text(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key} must be a non-empty string")
    return value


def _optional_text(table: Mapping[str, Any], key: str, where: str) -> str | None:
    if table.get(key) is None:
        return None
    return _text(table, key, where)


def _list(table: Mapping[str, Any], key: str) -> list[Any]:
    value = table.get(key)
    if not isinstance(value, list):
        raise ConfigError(f"descriptor.{key} must be a list")
    return value


def _texts(table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}.{key} must be a list of non-empty strings")
    return tuple(value)
