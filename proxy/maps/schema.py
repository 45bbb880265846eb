"""The packaged JSON Schema for tokenizer maps (`proxy/schemas/tokenizer-map.v2.schema.json`)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema_rs

SCHEMA_RESOURCE = "schemas/tokenizer-map.v2.schema.json"
# A problem quotes at most this much of the offending value: a wrong `vocab` is megabytes.
_MESSAGE_LIMIT = 160


@cache
def map_schema() -> dict[str, Any]:
    text = resources.files("proxy").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft7Validator(map_schema())


def _where(path: list[str | int]) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def schema_problems(document: Any, *, limit: int = 10) -> list[str]:
    """Up to `limit` schema violations of `document`, each one line: `$.merges[5]: ...`."""
    problems = []
    for error in _validator().iter_errors(document):
        message = " ".join(error.message.split())
        if len(message) > _MESSAGE_LIMIT:
            message = message[: _MESSAGE_LIMIT - 3] + "..."
        problems.append(f"{_where(error.instance_path)}: {message}")
        if len(problems) == limit:
            break
    return problems
