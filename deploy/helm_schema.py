"""Keep the chart's `config` value in step with proxy/settings.py.

    python -m deploy.helm_schema            # rewrite values.schema.json's `config` section
    python -m deploy.helm_schema --check    # exit 1 when it is out of date (a test runs this)

`config` takes any setting the chart does not set from values of its own (MANAGED), by its
config-file key, with the type and bounds the proxy checks at start. So `helm install` refuses
an unknown key or a wrong type before a pod ever starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from proxy.settings import Option, Settings

SCHEMA = Path(__file__).resolve().parent / "helm" / "codec-proxy" / "values.schema.json"

# Settings the chart derives from other values (mode, port, tokenizer.*, policy.*, apiKeys.*,
# drainTimeout) or that the image sets (host); `config` may not repeat them. The same list is
# in templates/_helpers.tpl ("codec-proxy.managedSettings").
MANAGED = (
    "upstream",
    "tokenizer",
    "host",
    "port",
    "drain_timeout",
    "version_policy",
    "deployment_id",
    "docs_url",
    "safety_policy",
    "enforce_safety_policy",
    "api_key",
    "api_key_file",
)


def _optional(kind: Any) -> Any | None:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _schema(kind: Any, option: Option) -> dict[str, Any]:
    inner = _optional(kind)
    if inner is not None:
        schema = _schema(inner, option)
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
        else:
            schema["type"] = [schema["type"], "null"]
        return schema
    origin = typing.get_origin(kind)
    if origin is Literal:
        return {"enum": list(typing.get_args(kind))}
    if origin is tuple:
        return {"type": "array", "items": _schema(typing.get_args(kind)[0], option)}
    if origin is dict:
        return {"type": "object"}
    if kind is bool:
        return {"type": "boolean"}
    if kind in (int, float):
        schema = {"type": "integer" if kind is int else "number"}
        if option.minimum is not None:
            schema["minimum"] = option.minimum
        if option.maximum is not None:
            schema["maximum"] = option.maximum
        return schema
    if kind in (str, Path):
        schema = {"type": "string", "minLength": 1}
        if option.url:
            schema["pattern"] = "^https?://"
        return schema
    raise TypeError(f"no JSON schema for settings of type {kind!r}")


def config_schema() -> dict[str, Any]:
    hints = typing.get_type_hints(Settings)
    properties = {}
    for field in dataclasses.fields(Settings):
        if field.name in MANAGED:
            continue
        option = field.metadata.get("option", Option())
        properties[field.name] = {"description": option.help, **_schema(hints[field.name], option)}
    return {
        "description": "Any other proxy setting, by its config-file key (codec-proxy "
        "config-example); generated from proxy/settings.py by python -m deploy.helm_schema.",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def render(current: dict[str, Any]) -> str:
    updated = {**current, "properties": {**current["properties"], "config": config_schema()}}
    return json.dumps(updated, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.helm_schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only tell whether it is current")
    args = parser.parse_args(argv)
    text = SCHEMA.read_text()
    wanted = render(json.loads(text))
    if text == wanted:
        return 0
    if args.check:
        print(f"{SCHEMA} is out of date: run python -m deploy.helm_schema", file=sys.stderr)
        return 1
    SCHEMA.write_text(wanted)
    print(f"updated {SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
