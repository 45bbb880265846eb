"""A safety policy for edge tests: distinctive rules (so a leak is easy to spot) on SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import codecai

from tests.core.safety.support import descriptor

# Rule contents that must never appear in a response, a header or a log line.
STOP_STRING = "New Haven"
REDACT_PATTERN = r"skyscrapers?|bustling"
ID_SEQUENCE = [11147, 1030, 15496]  # a made-up three-token sequence
PLACEHOLDER = " [redacted]"
SECRETS = [STOP_STRING, REDACT_PATTERN, "skyscrapers?", json.dumps(ID_SEQUENCE), "11147"]


def policy_document(stop_string: str = STOP_STRING) -> dict[str, Any]:
    doc = descriptor(places="stop", buildings="redact", sequences="stop")
    doc["id"] = "test/edge-policy-v1"
    doc["categories"][0]["description"] = "Place names the test bans."
    return {
        "descriptor": doc,
        "rules": {
            "banned_strings": [{"category": "places", "strings": [stop_string]}],
            "regexes": [{"category": "buildings", "pattern": REDACT_PATTERN, "max_length": 16}],
            "banned_ids": [{"category": "sequences", "sequences": [ID_SEQUENCE]}],
            "placeholders": {"buildings": PLACEHOLDER},
        },
    }


def write_policy(directory: Path, document: dict[str, Any] | None = None) -> Path:
    path = directory / "policy.json"
    path.write_text(json.dumps(document or policy_document()))
    return path


def v04() -> dict[str, str]:
    """The reference client's own version header (it sends 0.4)."""
    headers: dict[str, str] = codecai.with_codec_client_version({})
    return headers
