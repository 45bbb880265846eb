"""Loading a policy: descriptor schema facts, canonical bytes, rule validation, no leaks."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import codecai
import pytest

from proxy.core.errors import ConfigError
from proxy.core.safety.policy import load_policy
from proxy.core.safety.rules import Vocab
from tests.core.safety.support import TOY_VOCAB, document

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "safety-policy.example.toml"
SCHEMA_EXAMPLE: dict[str, Any] = {
    # The Codec repo's spec/examples/example-safety-policy.json, minus the two actions a proxy
    # cannot perform: its field order and values exercise every optional block.
    "id": "acme/strict-v3",
    "version": "1",
    "tokenizers": ["meta-llama/llama-3"],
    "categories": [
        {"name": "secrets", "action": "stop", "description": "API keys."},
        {"name": "pii", "action": "redact", "description": "Emails — and names."},
    ],
    "category_registry": "mlcommons/ailuminate-v0.5",
    "classifier": {
        "family": "llama-guard-3-1b",
        "host": "server",
        "requires_engine_features": ["logits_processor", "sampling_chain"],
    },
    "rules_summary": {"banned_token_id_count": 1, "regex_pattern_count": 1},
    "client_hooks": {"prefilter_categories": ["secrets"], "client_classifier_family": "pg-86m"},
    "published_at": "2026-05-09T00:00:00Z",
    "publisher": {"name": "Acme", "url": "https://acme.example/safety", "contact": "s@a.example"},
}
RULES = {
    "banned_ids": [{"category": "secrets", "ids": [42]}],
    "regexes": [{"category": "pii", "pattern": r"\w+@\w+\.com", "max_length": 40}],
    "placeholders": {"pii": [1, 2]},
}


def load(descriptor: dict[str, Any] | None = None, rules: dict[str, Any] | None = None):
    return load_policy(
        {"descriptor": descriptor or SCHEMA_EXAMPLE, "rules": rules or RULES}, TOY_VOCAB
    )


def test_canonical_bytes_equal_the_reference_clients() -> None:
    policy = load()
    reference = codecai.descriptor_from_json(json.loads(policy.canonical))
    assert codecai.descriptor_canonical_bytes(reference) == policy.canonical
    assert codecai.hash_safety_policy(reference) == policy.hash_header
    # Key order is the schema's, not sorted, and the bytes end with one newline.
    assert list(json.loads(policy.canonical)) == [
        "id",
        "version",
        "tokenizers",
        "categories",
        "classifier",
        "category_registry",
        "rules_summary",
        "client_hooks",
        "published_at",
        "publisher",
    ]
    assert policy.canonical.endswith(b"}\n")
    assert "Emails — and names." in policy.canonical.decode()  # UTF-8, not \u escapes


def test_input_key_order_does_not_change_the_bytes() -> None:
    shuffled = dict(reversed(list(SCHEMA_EXAMPLE.items())))
    shuffled["classifier"] = dict(reversed(list(SCHEMA_EXAMPLE["classifier"].items())))
    assert load(shuffled).canonical == load().canonical


def test_the_example_policy_file_loads() -> None:
    raw = tomllib.loads(EXAMPLE.read_text())
    vocab = Vocab(size=49152, encode=lambda text: [1] * len(text), decode=lambda ids: "x")
    policy = load_policy(raw, vocab)
    assert policy.id == "example/smollm2-baseline-v1"
    assert policy.rules.actions == {"secrets": "stop", "pii": "redact", "role_escape": "stop"}
    # The published summary was checked against the rules.
    assert policy.descriptor.rules_summary is not None
    assert policy.descriptor.rules_summary.regex_pattern_count == 2


def mutated(path: str, value: Any) -> dict[str, Any]:
    doc = {"descriptor": copy.deepcopy(SCHEMA_EXAMPLE), "rules": copy.deepcopy(RULES)}
    *parents, last = path.split(".")
    target: Any = doc
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("descriptor.id", "Acme/Upper", "descriptor.id"),
        ("descriptor.id", "acme/../etc", "descriptor.id"),
        ("descriptor.id", "/acme", "descriptor.id"),
        ("descriptor.id", "acme/", "descriptor.id"),
        ("descriptor.version", "2", "descriptor.version"),
        ("descriptor.tokenizers", [], "tokenizers"),
        ("descriptor.categories", [], "categories"),
        ("descriptor.categories.0.name", "Bad Name", "name"),
        ("descriptor.categories.0.action", "regenerate", "enforces only stop and redact"),
        ("descriptor.categories.0.action", "explode", "action"),
        ("descriptor.classifier", KeyError, "classifier"),
        ("descriptor.classifier.host", "cloud", "host"),
        ("descriptor.published_at", "yesterday", "published_at"),
        ("descriptor.published_at", "2026-05-09T00:00:00", "time zone"),
        ("descriptor.extra", 1, "unknown key"),
        ("descriptor.rules_summary.regex_pattern_count", 3, "disagrees"),
        ("descriptor.client_hooks.prefilter_categories", ["nope"], "declared categories"),
        ("rules.banned_ids.0.ids", [1000], "not a token ID"),
        ("rules.banned_ids.0.category", "nope", "category"),
        ("rules.regexes.0.max_length", 0, "max_length"),
        ("rules.regexes.0.pattern", "a*", "empty string"),
        ("rules.placeholders", {}, "without a placeholder"),
        ("rules.placeholders.secrets", "x", "redact categories only"),
        ("rules.regexes", [], "without any rule: pii"),
        ("rules.unknown", [], "unknown key"),
    ],
)
def test_invalid_policies_are_refused_with_a_useful_message(
    path: str, value: Any, message: str
) -> None:
    doc = mutated(path, value)
    with pytest.raises(ConfigError, match=message):
        load_policy(doc, TOY_VOCAB)


SECRET_PATTERN = r"hunter2-(?P<x>[0-9]+"  # does not compile: missing ")"
SECRET_STRING = "correct horse battery staple"


@pytest.mark.parametrize(
    "doc",
    [
        document(stop_regexes=[(SECRET_PATTERN, 30)]),
        document(stop_strings=[SECRET_STRING], stop_regexes=[(SECRET_STRING + "(", 40)]),
        document(stop_strings=[SECRET_STRING], stop_ids=[[999, 1000]]),
    ],
)
def test_error_messages_never_quote_a_rule(doc: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_policy(doc, TOY_VOCAB)
    text = str(caught.value) + repr(caught.value) + caught.value.message
    for secret in ("hunter2", SECRET_STRING, "999", "1000"):
        assert secret not in text


def test_repr_of_a_loaded_policy_shows_no_rule() -> None:
    policy = load_policy(
        document(stop_strings=[SECRET_STRING], redact_regexes=[("hunter2", 9)]), TOY_VOCAB
    )
    assert SECRET_STRING not in repr(policy)
    assert "hunter2" not in repr(policy)
    assert "hunter2" not in repr(policy.rules)
