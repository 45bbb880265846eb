"""Settings from a TOML or YAML file, overridden by `CODEC_PROXY_*` variables, overridden by flags.

Everything here is derived from the `Settings` dataclass: its field names are the file keys,
`CODEC_PROXY_<NAME>` the environment variables, `--<name-with-dashes>` the flags; its type
annotations say how a value is parsed and checked, and each field's `Option` metadata carries
the help text, bounds and whether it is a secret. Adding a setting is adding one field.

Every problem stops the process with one line naming the key and what is wrong, e.g.
`config.toml: 'ttft_timeout' must be >= 0, got -1`. No line shows a secret setting's value, nor
the text a parser quotes from the file (the line at fault may hold a key).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from proxy.core.errors import ConfigError
from proxy.core.shown import without_credentials
from proxy.core.steady import ENV_SWITCH
from proxy.settings import ModelSettings, Option, Settings

ENV_PREFIX = "CODEC_PROXY_"
# Variables with our prefix that are not settings: proxy/assets.py's download cache, and the
# switch that leaves the native steady path out (read at build and at import, not a setting).
_NOT_SETTINGS = frozenset({"CODEC_PROXY_CACHE", ENV_SWITCH})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: Any  # the resolved type annotation
    option: Option
    required: bool

    @property
    def flag(self) -> str:
        return "--" + (self.option.flag or self.name.replace("_", "-"))

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _fields(cls: type = Settings) -> list[_Field]:
    hints = typing.get_type_hints(cls)
    return [
        _Field(
            field.name,
            hints[field.name],
            field.metadata.get("option", Option()),
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)
        if "option" in field.metadata or cls is Settings
    ]


def setting_names() -> list[str]:
    return [field.name for field in _fields()]


_UNSET = frozenset({"", "none", "null"})


def _optional_inner(kind: Any) -> Any | None:
    """`X | None` -> X; anything else -> None."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0]
    return None


def _describe(kind: Any) -> str:
    inner = _optional_inner(kind)
    if inner is not None:
        return f"{_describe(inner)} or null"
    origin = typing.get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(kind))
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(kind)[0])}"
    if kind is ModelSettings:
        return "a table"
    if origin is dict:
        return "a table of name = value"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        kind, "a path" if kind is Path else str(kind)
    )


def _got(value: Any, secret: bool) -> str:
    """How an error names the value it refuses: a secret's only by its kind, a URL without
    its credentials."""
    if not secret:
        return f"got {without_credentials(repr(value))}"
    kinds = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table", type(None): "null"}  # fmt: skip
    return f"got {kinds.get(type(value), 'a value')} (secret: not shown)"


def _convert(kind: Any, value: Any, *, from_text: bool, secret: bool = False) -> Any:
    """Check (from a file) or parse (from text) one value; raise ValueError with the reason.

    `secret`: a key setting. One that is present but empty (a variable set to "", a template
    that rendered nothing) is an error, never "no keys": only the word "none" unsets it.
    """
    inner = _optional_inner(kind)
    if inner is not None:
        # TOML has no null: the string "none" unsets an optional value in files and flags too.
        if value is None or (isinstance(value, str) and value.strip().lower() in _UNSET):
            if secret and (value is None or not value.strip()):
                raise ValueError('is empty (to set none, write "none")')
            return None
        return _convert(inner, value, from_text=from_text, secret=secret)
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise ValueError(f"must be {_describe(kind)}, {_got(value, secret)}")
        return value
    if origin is tuple:
        item = typing.get_args(kind)[0]
        if item is ModelSettings:
            return _models(value, from_text=from_text)
        if from_text:
            items = [part.strip() for part in value.split(",") if part.strip()]
            if secret and not items:
                raise ValueError("is set but holds no key (unset it for none)")
        elif isinstance(value, str):
            items = [value]  # one value where a list is expected: a list of one
        elif isinstance(value, list | tuple):
            items = list(value)
        else:
            raise ValueError(f"must be {_describe(kind)}, {_got(value, secret)}")
        return tuple(_convert(item, v, from_text=from_text, secret=secret) for v in items)
    if origin is dict:
        value_kind = typing.get_args(kind)[1]
        if from_text:
            pairs = [part.partition("=") for part in value.split(",") if part.strip()]
            if any(not sep for _, sep, _ in pairs):
                raise ValueError(f"must be name=value pairs, {_got(value, secret)}")
            value = {k.strip(): v.strip() for k, _, v in pairs}
        if not isinstance(value, dict):
            raise ValueError(f"must be {_describe(kind)}, {_got(value, secret)}")
        return {
            str(k): _convert(value_kind, v, from_text=from_text, secret=secret)
            for k, v in value.items()
        }
    if kind is bool:
        # Text (and, in files, the strings "on"/"off" that mirror `--flag off`) or a real bool.
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in _TRUE | _FALSE:
                return lowered in _TRUE
        elif isinstance(value, bool):
            return value
        raise ValueError(f"must be true or false (or on/off), {_got(value, secret)}")
    if kind is int:
        if from_text:
            try:
                return int(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"must be an integer, {_got(value, secret)}")
    if kind is float:
        if from_text:
            try:
                return float(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"must be a number, {_got(value, secret)}")
    if kind is Path and isinstance(value, Path):
        return value
    if kind is str or kind is Path:
        if isinstance(value, str) and (value.strip() if secret else value):
            return Path(value) if kind is Path else value
        raise ValueError(f"must be a non-empty string, {_got(value, secret)}")
    raise ValueError(f"has an unsupported type {kind!r}")  # a programming error in Settings


def _models(value: Any, *, from_text: bool) -> tuple[ModelSettings, ...]:
    """The `models` list: a table per model, each key checked like a top-level one."""
    if from_text:
        raise ValueError("can only be set in a config file (a list of tables)")
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of tables, got {value!r}")
    known = {f.name: f for f in _fields(ModelSettings)}
    entries = []
    for index, table in enumerate(value):
        if isinstance(table, ModelSettings):
            entries.append(table)
            continue
        if not isinstance(table, dict):
            raise ValueError(f"entry {index} must be a table, got {table!r}")
        where = f"entry {index}" + (f" ({table['name']!r})" if isinstance(table.get("name"), str)
                                    else "")  # fmt: skip
        values: dict[str, Any] = {}
        for name, raw in table.items():
            field = known.get(str(name))
            if field is None:
                raise ValueError(f"{where}: unknown key {name!r}")
            try:
                values[field.name] = _convert(field.kind, raw, from_text=False)
                _check_bounds(field, values[field.name])
            except ValueError as exc:
                raise ValueError(f"{where}: {field.name!r} {exc}") from exc
        missing = [f.name for f in known.values() if f.required and f.name not in values]
        if missing:
            raise ValueError(f"{where}: {missing[0]!r} is required")
        try:
            entries.append(ModelSettings(**values))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
    return tuple(entries)


def _check_bounds(field: _Field, value: Any) -> None:
    option = field.option
    values = value if isinstance(value, tuple) else (value,)
    for item in values:
        if isinstance(item, int | float) and not isinstance(item, bool):
            got = "" if option.secret else f", got {item:g}"
            if option.minimum is not None and item < option.minimum:
                raise ValueError(f"must be >= {option.minimum:g}{got}")
            if option.maximum is not None and item > option.maximum:
                raise ValueError(f"must be <= {option.maximum:g}{got}")
        if option.url and isinstance(item, str) and not item.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, {_got(item, option.secret)}")


def read_file(path: Path) -> dict[str, Any]:
    """A TOML (`.toml`) or YAML (`.yaml`, `.yml`) file as a mapping of keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"{path}: unknown config format (use .toml, .yaml or .yml)")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {_syntax(exc)}") from exc
    except Exception as exc:  # yaml.YAMLError, without importing yaml for TOML users
        if type(exc).__module__.startswith("yaml"):
            raise ConfigError(f"{path}: not valid YAML: {_syntax(exc)}") from exc
        raise
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table of keys")
    return data


# A quoted piece of a parser's message: what it quotes from the file.
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'" + r'|"((?:[^"\\]|\\.)*)"')
# Quoted pieces that cannot hold a key: one character (or its escape), a token kind (`<scalar>`).
_HARMLESS = re.compile(r"[^\\]|\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|.)|<[a-z ]+>")


def _syntax(exc: Exception) -> str:
    """Where a parser stopped and why, on one line, without the file's text: the line at fault
    may hold a key, and PyYAML quotes it whole (TOML and YAML messages also quote keys,
    aliases and tags). Only quoted single characters and token kinds are kept."""
    mark = getattr(exc, "problem_mark", None)  # PyYAML's MarkedYAMLError
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        text = f"{problem} (at line {mark.line + 1}, column {mark.column + 1})"
    else:
        text = str(exc)

    def shown(match: re.Match[str]) -> str:
        quoted = match.group(1) if match.group(1) is not None else match.group(2)
        return match.group(0) if _HARMLESS.fullmatch(quoted) else "…"

    return _QUOTED.sub(shown, " ".join(text.split()))


@dataclasses.dataclass(frozen=True)
class Loaded:
    """Settings, and which of them the sources state rather than leave to their defaults."""

    settings: Settings
    # Each key the file, a variable or a flag gives; `models[name].key` for a key of a models
    # entry. A reload widens access only by what is stated (proxy/reloading.py `unstated`).
    stated: frozenset[str]


def load(
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    require: bool = True,
) -> Settings:
    """Merge the three sources over the defaults, validate, and build `Settings`."""
    return read(file=file, env=env, flags=flags, require=require).settings


def read(
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    require: bool = True,
) -> Loaded:
    """`load`, and the keys the sources state."""
    known = {f.name: f for f in _fields()}
    values: dict[str, Any] = {}
    stated: set[str] = set()

    def put(source: str, name: str, raw: Any, *, from_text: bool) -> None:
        field = known.get(name)
        if field is None:
            raise ConfigError(f"{source}: unknown key {name!r}")
        try:
            value = _convert(field.kind, raw, from_text=from_text, secret=field.option.secret)
            _check_bounds(field, value)
        except ValueError as exc:
            label = field.env if source == "environment" else name
            raise ConfigError(f"{source}: {label!r} {exc}") from exc
        values[name] = value
        stated.add(name)
        if name == "models":
            model_keys = [f.name for f in _fields(ModelSettings)]
            for entry, given in zip(value, raw, strict=True):
                keys = given.keys() if isinstance(given, dict) else model_keys
                stated.update(f"models[{entry.name}].{key}" for key in keys)

    if file is not None:
        for name, raw in read_file(file).items():
            put(str(file), str(name), raw, from_text=False)
    for key, raw in (os.environ if env is None else env).items():
        if key.startswith(ENV_PREFIX) and key not in _NOT_SETTINGS:
            name = key[len(ENV_PREFIX) :].lower()
            if name in known:
                put("environment", name, raw, from_text=True)
            else:
                raise ConfigError(f"environment: unknown variable {key!r}")
    for name, raw in (flags or {}).items():
        if raw is not None:
            put("command line", name, raw, from_text=False)
    if require and not values.get("models"):
        # One model by flags or keys, or several in the file's `models` list.
        # A Codec upstream's published map is its tokenizer (settings.py).
        needed = ("upstream",) if values.get("upstream_protocol") == "codec" else (
            "upstream", "tokenizer")  # fmt: skip
        missing = [known[n] for n in needed if not values.get(n)]
        if missing:
            field = missing[0]
            raise ConfigError(
                f"{field.name!r} is required: pass {field.flag}, set {field.env}, "
                f"or put {field.name!r} (or a 'models' list) in the config file"
            )
    try:
        return Loaded(Settings(**values), frozenset(stated))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def add_flags(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset()) -> None:
    """One flag per setting, defaulting to None so that only flags given override."""
    for field in _fields():
        if field.name in skip:
            continue
        kwargs: dict[str, Any] = {"dest": field.name, "default": None, "help": field.option.help}
        kind = _optional_inner(field.kind) or field.kind
        origin = typing.get_origin(kind)
        if kind is bool:
            # `--flag` alone means on; `--flag off` (or false/no/0) means off.
            kwargs.update(nargs="?", const=True, type=_flag_bool, metavar="on|off")
        elif origin is tuple:
            kwargs["action"] = "append"
            kwargs["metavar"] = field.name.rstrip("s").upper()
        elif origin is dict:
            kwargs["action"] = _PairsAction
            kwargs["metavar"] = "NAME=VALUE"
        elif origin is Literal:
            kwargs["choices"] = typing.get_args(kind)
        else:
            kwargs["type"] = {int: int, float: float}.get(kind, str)
        if field.option.secret:
            kwargs["help"] = f"{field.option.help} (secret: never logged)"
        parser.add_argument(field.flag, **kwargs)


def _flag_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in _TRUE | _FALSE:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return lowered in _TRUE


class _PairsAction(argparse.Action):
    """`--flag name=value`, repeatable, into a dict."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name, sep, value = str(values).partition("=")
        if not sep:
            parser.error(f"{option_string} expects NAME=VALUE, got {values!r}")
        current = dict(getattr(namespace, self.dest) or {})
        current[name] = value
        setattr(namespace, self.dest, current)


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (argparse namespace -> {field name: value})."""
    names = {f.name for f in _fields()}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


EXAMPLE_HEADER = """\
# codec-proxy configuration: every setting, with its default.
#
# Generated from proxy/settings.py by `codec-proxy config-example`; a test keeps it in step.
# Each key can also be set as an environment variable CODEC_PROXY_<KEY> (upper case; lists
# comma-separated) or a flag --<key-with-dashes>. Flags beat variables, variables beat this file.
# Check a file without starting: codec-proxy check-config FILE
"""

# Example values for the settings that have no default.
_REQUIRED_EXAMPLES = {"upstream": ("http://127.0.0.1:8000",), "tokenizer": "/models/model.gguf"}


def example_toml() -> str:
    """A config file with every setting, its help text and its default."""
    defaults = Settings(**_REQUIRED_EXAMPLES)  # type: ignore[arg-type]
    lines = [EXAMPLE_HEADER]
    for field in _fields():
        if field.name == "models":
            continue  # tables come last in TOML: shown below
        value = getattr(defaults, field.name)
        lines.append(f"# {field.option.help}" + (" (required)" if field.required else ""))
        example = field.option.example
        prefix = "# " if value is None or example is not None else ""
        shown = example or ("..." if value is None else _toml_value(value))
        lines.append(f"{prefix}{field.name} = {shown}\n")
    lines.append(_MODELS_EXAMPLE_HEADER)
    for field in _fields(ModelSettings):
        required = " (required)" if field.required else ""
        lines.append(f"#   {field.name}: {field.option.help}{required}")
    lines.append(_MODELS_EXAMPLE)
    return "\n".join(lines)


_MODELS_EXAMPLE_HEADER = """
# Several models behind one proxy (docs/DEPLOY.md "Several models"): leave out upstream,
# tokenizer, model, map_id and zstd_dicts above, and list each model instead. Requests are
# routed by their `model` (Path B: the Codec-Model header), unknown names get 404
# model_not_found, and those that name none go to default_model. Keys of an entry:"""

_MODELS_EXAMPLE = """
# default_model = "llama-3.1-8b"
#
# [[models]]
# name = "llama-3.1-8b"
# aliases = ["llama3"]
# upstreams = ["http://vllm-llama:8000"]
# tokenizer = "/models/llama-3.1-8b/"
# required = true
#
# [[models]]
# name = "qwen3-8b"
# upstreams = ["http://vllm-qwen-a:8000", "http://vllm-qwen-b:8000"]
# tokenizer = "/models/qwen3-8b/tokenizer.json"
# token_ids = "backend"
"""


def describe(settings: Settings) -> str:
    """The effective settings, one `key = value` per line, secrets and URL credentials redacted."""
    lines = []
    for field in _fields():
        value = getattr(settings, field.name)
        if field.option.secret and value:
            value = "<redacted>"
        lines.append(without_credentials(f"{field.name} = {value!r}"))
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ConfigSource:
    """How a process was configured, kept so that a reload (SIGHUP) reads the same way: the
    file again, over the environment and flags it started with, which still beat the file."""

    file: Path | None = None
    # Not in the repr: both may hold API keys.
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    flags: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def of_process(cls, file: Path | None, flags: Mapping[str, Any]) -> ConfigSource:
        """This process's: its `CODEC_PROXY_*` variables as they are now (they cannot change
        from outside while it runs), its flags."""
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        return cls(file, env, dict(flags))

    def load(self) -> Settings:
        """The settings as the sources say now; `ConfigError` naming the key and the problem."""
        return self.read().settings

    def read(self) -> Loaded:
        """`load`, and which keys the sources state (the file read once)."""
        return read(file=self.file, env=self.env, flags=self.flags)
