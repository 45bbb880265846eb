"""A loaded safety policy: the published descriptor (bytes, hash, headers) and the rules.

The policy file is one table with two parts: `descriptor` (public, served as canonical bytes
at `/.well-known/codec/policies/<id>.json` and `.../sha256/<hex>.json`) and `rules` (private).
Reading the file is the edge's job; this module only turns its parsed content into a policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.errors import ConfigError
from proxy.core.safety.descriptor import PolicyDescriptor, parse_descriptor, sha256_hex
from proxy.core.safety.rules import CompiledRules, Vocab, compile_rules

WELL_KNOWN_POLICIES = "/.well-known/codec/policies"


@dataclass(frozen=True)
class SafetyPolicy:
    descriptor: PolicyDescriptor
    canonical: bytes = field(repr=False)
    sha256: str  # lowercase hex of `canonical`
    rules: CompiledRules = field(repr=False)

    @property
    def id(self) -> str:
        return self.descriptor.id

    @property
    def hash_header(self) -> str:
        return f"sha256:{self.sha256}"

    @property
    def id_path(self) -> str:
        return f"{WELL_KNOWN_POLICIES}/{self.id}.json"

    @property
    def hash_path(self) -> str:
        return f"{WELL_KNOWN_POLICIES}/sha256/{self.sha256}.json"

    def response_headers(self) -> tuple[tuple[str, str], ...]:
        """Headers on every response the policy governs. The version floor table withholds
        them from clients below 0.4 (proxy/core/http/versioning.py), in one place."""
        return (
            ("Codec-Safety-Policy", self.id),
            ("Codec-Safety-Policy-Id", self.id),
            ("Codec-Safety-Policy-Hash", self.hash_header),
        )


def load_policy(document: Any, vocab: Vocab) -> SafetyPolicy:
    """A policy from the parsed file: `{"descriptor": {...}, "rules": {...}}`."""
    if not isinstance(document, Mapping):
        raise ConfigError("a safety policy file must hold a table")
    unknown = sorted(set(document) - {"descriptor", "rules"})
    if unknown:
        raise ConfigError(f"safety policy has unknown key(s): {', '.join(unknown)}")
    if "descriptor" not in document or "rules" not in document:
        raise ConfigError("a safety policy needs both a [descriptor] and a [rules] table")
    descriptor = parse_descriptor(document["descriptor"])
    rules = compile_rules(document["rules"], descriptor, vocab)
    canonical = descriptor.canonical_bytes()
    return SafetyPolicy(descriptor, canonical, sha256_hex(canonical), rules)
