"""Keep the chart's `config` and `models` values in step with proxy/settings.py.

    python -m deploy.helm_schema            # rewrite values.schema.json's two sections
    python -m deploy.helm_schema --check    # exit 1 when they are out of date (a test runs this)

`config` takes any setting the chart does not set from values of its own (MANAGED) and that is
no secret, by its config-file key, with the type and bounds the proxy checks at start. `models`
takes entries of the config file's `models` list (proxy.settings.ModelSettings), checked the
same way, but for `tokenizer`: there the chart takes where to mount it from. So `helm install`
refuses an unknown key or a wrong type before a pod ever starts.
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

from proxy.settings import ModelSettings, Option, Settings

SCHEMA = Path(__file__).resolve().parent / "helm" / "codec-proxy" / "values.schema.json"

# Settings the chart derives from other values (mode, port, adminPort, tokenizer.*,
# upstreamProtocol, models,
# defaultModel, policy.*, apiKeys.*, drainTimeout) or that the image sets (host); `config` may
# not repeat them. The same list is in templates/_helpers.tpl ("codec-proxy.managedSettings").
MANAGED = (
    "upstream",
    "tokenizer",
    "upstream_protocol",
    "models",
    "default_model",
    "host",
    "port",
    "admin_port",
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


def _option(field: dataclasses.Field[Any]) -> Option:
    option: Option = field.metadata.get("option", Option())
    return option


def secret_settings() -> list[str]:
    """The secrets `config` refuses: it becomes a ConfigMap, which is no place for them. Those
    the chart takes from a Secret itself (api_key_file) are in MANAGED; the rest go through
    extraEnv (valueFrom.secretKeyRef). The same list is in templates/_helpers.tpl
    ("codec-proxy.secretSettings")."""
    return [
        f.name for f in dataclasses.fields(Settings) if _option(f).secret and f.name not in MANAGED
    ]


def config_schema() -> dict[str, Any]:
    hints = typing.get_type_hints(Settings)
    properties = {}
    secret = secret_settings()
    for field in dataclasses.fields(Settings):
        if field.name in MANAGED or field.name in secret:
            continue
        option = _option(field)
        properties[field.name] = {"description": option.help, **_schema(hints[field.name], option)}
    return {
        "description": "Any other proxy setting, by its config-file key (codec-proxy "
        "config-example); generated from proxy/settings.py by python -m deploy.helm_schema.",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


# A `models` entry's `tokenizer`: where the chart mounts it from (templates/_helpers.tpl,
# "codec-proxy.tokenizers"), the single-model `tokenizer` value's keys with defaults of its own.
MODEL_TOKENIZER: dict[str, Any] = {
    "description": "where the chart mounts this model's tokenizer from (values.yaml, "
    "`tokenizer`); the entry's `tokenizer` setting becomes the path it is at",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "source": {"enum": ["volume", "configMap", "image"]},
        "mountPath": {"type": "string", "pattern": "^/"},
        "path": {"type": "string"},
        "subPath": {"type": "string"},
        "volume": {"type": "object"},
        "existingVolume": {"type": "string"},
        "configMap": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "key": {"type": "string", "minLength": 1},
            },
        },
    },
}


def models_schema() -> dict[str, Any]:
    hints = typing.get_type_hints(ModelSettings)
    properties: dict[str, Any] = {}
    required = []
    for field in dataclasses.fields(ModelSettings):
        option = _option(field)
        if field.default is dataclasses.MISSING:
            required.append(field.name)
        if field.name == "tokenizer":
            properties[field.name] = MODEL_TOKENIZER
            continue
        schema = {"description": option.help, **_schema(hints[field.name], option)}
        if field.name in required and schema.get("type") == "array":
            schema["minItems"] = 1  # a required list is a non-empty one (`upstreams`)
        properties[field.name] = schema
    return {
        "description": "Several models behind one proxy: the config file's `models` entries, "
        "but for `tokenizer`; generated from proxy/settings.py by python -m deploy.helm_schema.",
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": required,
            "properties": properties,
        },
    }


def render(current: dict[str, Any]) -> str:
    properties = {**current["properties"], "config": config_schema(), "models": models_schema()}
    return json.dumps({**current, "properties": properties}, indent=2) + "\n"


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
