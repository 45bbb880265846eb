"""The private half of a safety policy: banned token IDs, banned strings, regular expressions.

None of it is ever published (codec-spec.md §8: "Never publish banned IDs, thresholds, weights,
or regex text"), so nothing here ends up in a message either: errors name a rule by its place
in the file (`rules.regexes[2]`), never by its content, and the dataclasses hide their
contents from `repr()` in case one is ever logged by accident.

File shape (a table; see config/safety-policy.example.toml):

    [rules]
    regex_max_length = 64                      # default bound for regexes, in characters
    [[rules.banned_ids]]     category, ids = [..] (each banned alone), sequences = [[..], ..]
    [[rules.banned_strings]] category, strings = [..]
    [[rules.regexes]]        category, pattern, max_length (optional)
    [rules.placeholders]     <redact category> = "text" | [token IDs]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import regex

from proxy.core.errors import ConfigError
from proxy.core.safety.automaton import Automaton
from proxy.core.safety.descriptor import PolicyDescriptor

Action = Literal["stop", "redact"]
ENFORCED_ACTIONS: tuple[Action, ...] = ("stop", "redact")

# Regexes are matched incrementally; a match is guaranteed to be found only if it spans at
# most `max_length` characters, and that bound is also the most text a regex can ever hold
# back (see proxy/core/safety/regex_scan.py).
DEFAULT_REGEX_MAX_LENGTH = 64
REGEX_MAX_LENGTH_LIMIT = 4096

_RULE_KINDS = {"banned_ids", "banned_strings", "regexes", "placeholders", "regex_max_length"}


@dataclass(frozen=True, slots=True)
class Placeholder:
    """What replaces a redacted span: token IDs for Codec, their text for JSON."""

    ids: tuple[int, ...] = field(repr=False)
    text: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class RegexRule:
    pattern: regex.Pattern[str] = field(repr=False)
    max_length: int
    category: str


@dataclass(frozen=True)
class CompiledRules:
    """Everything a stream matcher needs, built once at start-up and shared by all streams."""

    ids: Automaton[int] = field(repr=False)
    id_categories: tuple[str, ...] = field(repr=False)
    strings: Automaton[str] = field(repr=False)
    string_categories: tuple[str, ...] = field(repr=False)
    regexes: tuple[RegexRule, ...] = field(repr=False)
    actions: Mapping[str, Action]
    placeholders: Mapping[str, Placeholder] = field(repr=False)
    counts: Mapping[str, int]

    @property
    def context_chars(self) -> int:
        """Released text kept for regex look-behind: as much as the longest regex match."""
        return max((rule.max_length for rule in self.regexes), default=0)

    @property
    def max_holdback(self) -> tuple[int, int]:
        """The most a clean stream can be held back: (token IDs, characters)."""
        chars = max(self.strings.longest - 1, self.context_chars - 1, 0)
        return max(self.ids.longest - 1, 0), chars


@dataclass(frozen=True)
class Vocab:
    """What rule compilation needs from the model's tokenizer (pure callables)."""

    size: int
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]


def compile_rules(raw: Any, descriptor: PolicyDescriptor, vocab: Vocab) -> CompiledRules:
    """Validate the `[rules]` table against the descriptor's categories; `ConfigError` if bad."""
    if not isinstance(raw, Mapping):
        raise ConfigError("rules must be a table")
    unknown = sorted(set(raw) - _RULE_KINDS)
    if unknown:
        raise ConfigError(f"rules has unknown key(s): {', '.join(unknown)}")
    actions = _actions(descriptor)
    default_max = _max_length(raw.get("regex_max_length", DEFAULT_REGEX_MAX_LENGTH), "rules")

    id_patterns: list[tuple[int, ...]] = []
    id_categories: list[str] = []
    for i, entry in enumerate(_entries(raw, "banned_ids")):
        where = f"rules.banned_ids[{i}]"
        category = _category(entry, where, actions, {"ids", "sequences"})
        sequences: list[tuple[int, ...]] = [
            (token,) for token in _id_list(entry.get("ids", []), f"{where}.ids", vocab)
        ]
        nested = entry.get("sequences", [])
        if not isinstance(nested, list):
            raise ConfigError(f"{where}.sequences must be a list of lists of token IDs")
        for j, sequence in enumerate(nested):
            ids = _id_list(sequence, f"{where}.sequences[{j}]", vocab)
            if not ids:
                raise ConfigError(f"{where}.sequences[{j}] is empty")
            sequences.append(ids)
        if not sequences:
            raise ConfigError(f"{where} bans nothing")
        id_patterns += sequences
        id_categories += [category] * len(sequences)

    strings: list[str] = []
    string_categories: list[str] = []
    for i, entry in enumerate(_entries(raw, "banned_strings")):
        where = f"rules.banned_strings[{i}]"
        category = _category(entry, where, actions, {"strings"})
        values = entry.get("strings")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.strings must be a non-empty list of strings")
        for j, value in enumerate(values):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{where}.strings[{j}] must be a non-empty string")
        strings += values
        string_categories += [category] * len(values)

    regexes = tuple(
        _regex(entry, f"rules.regexes[{i}]", actions, default_max)
        for i, entry in enumerate(_entries(raw, "regexes"))
    )

    counts = {
        "banned_token_id_count": sum(len(p) == 1 for p in id_patterns),
        "multi_token_pattern_count": sum(len(p) > 1 for p in id_patterns) + len(strings),
        "regex_pattern_count": len(regexes),
        "grammar_constraint_count": 0,
    }
    used = set(id_categories) | set(string_categories) | {r.category for r in regexes}
    idle = [name for name in actions if name not in used]
    if idle:
        # Publishing a category the proxy never acts on would misstate what is enforced.
        raise ConfigError(f"categories without any rule: {', '.join(idle)}")
    _check_summary(descriptor, counts)
    return CompiledRules(
        ids=Automaton(id_patterns),
        id_categories=tuple(id_categories),
        strings=Automaton(strings),
        string_categories=tuple(string_categories),
        regexes=regexes,
        actions=actions,
        placeholders=_placeholders(raw.get("placeholders", {}), actions, vocab),
        counts=counts,
    )


def _check_summary(descriptor: PolicyDescriptor, counts: Mapping[str, int]) -> None:
    # The published summary is optional, but when present it must describe these rules: an
    # auditor compares policies by it (safety-policy schema, `rules_summary`).
    summary = descriptor.rules_summary
    if summary is None:
        return
    wrong = [
        name
        for name, count in counts.items()
        if getattr(summary, name) is not None and getattr(summary, name) != count
    ]
    if wrong:
        raise ConfigError(
            f"descriptor.rules_summary disagrees with the rules on: {', '.join(sorted(wrong))}"
        )


def _actions(descriptor: PolicyDescriptor) -> dict[str, Action]:
    actions: dict[str, Action] = {}
    for category in descriptor.categories:
        if category.action == "stop":
            actions[category.name] = "stop"
        elif category.action == "redact":
            actions[category.name] = "redact"
        else:
            # `regenerate` needs the sampler and `flag` a frame annotation that Codec HTTP
            # frames cannot carry; a proxy in front of an unmodified backend has neither.
            raise ConfigError(
                f"category {category.name!r} has action {category.action!r}: "
                f"codec-proxy enforces only {' and '.join(ENFORCED_ACTIONS)}"
            )
    return actions


def _entries(raw: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    value = raw.get(kind, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConfigError(f"rules.{kind} must be a list of tables ([[rules.{kind}]])")
    return value


def _category(
    entry: Mapping[str, Any], where: str, actions: Mapping[str, Action], keys: set[str]
) -> str:
    unknown = sorted(set(entry) - keys - {"category"})
    if unknown:
        raise ConfigError(f"{where} has unknown key(s): {', '.join(unknown)}")
    category = entry.get("category")
    if not isinstance(category, str) or category not in actions:
        raise ConfigError(f"{where}.category must name a category of the descriptor")
    return category


def _id_list(value: Any, where: str, vocab: Vocab) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list of token IDs")
    for token in value:
        if type(token) is not int or not 0 <= token < vocab.size:
            raise ConfigError(f"{where} holds a value that is not a token ID of this model")
    return tuple(value)


def _max_length(value: Any, where: str) -> int:
    if type(value) is not int or not 1 <= value <= REGEX_MAX_LENGTH_LIMIT:
        raise ConfigError(
            f"{where} regex max_length must be an integer in [1, {REGEX_MAX_LENGTH_LIMIT}]"
        )
    return value


def _regex(
    entry: Mapping[str, Any], where: str, actions: Mapping[str, Action], default_max: int
) -> RegexRule:
    category = _category(entry, where, actions, {"pattern", "max_length"})
    source = entry.get("pattern")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{where}.pattern must be a non-empty string")
    try:
        pattern = regex.compile(source)
    except regex.error as exc:
        # `regex` errors say what and where ("missing ) at position 4"), never the pattern.
        raise ConfigError(f"{where}.pattern does not compile: {exc}") from exc
    if pattern.fullmatch("") is not None:
        raise ConfigError(f"{where}.pattern matches the empty string")
    max_length = _max_length(entry.get("max_length", default_max), where)
    return RegexRule(pattern, max_length, category)


def _placeholders(raw: Any, actions: Mapping[str, Action], vocab: Vocab) -> dict[str, Placeholder]:
    if not isinstance(raw, Mapping):
        raise ConfigError("rules.placeholders must be a table: category = text or [IDs]")
    out: dict[str, Placeholder] = {}
    for name, value in raw.items():
        where = f"rules.placeholders.{name}"
        if actions.get(name) != "redact":
            raise ConfigError(f"{where}: placeholders are for redact categories only")
        if isinstance(value, str):
            out[name] = Placeholder(tuple(vocab.encode(value)), value)
        else:
            ids = _id_list(value, where, vocab)
            out[name] = Placeholder(ids, vocab.decode(ids))
    missing = [name for name, action in actions.items() if action == "redact" and name not in out]
    if missing:
        raise ConfigError(f"redact categories without a placeholder: {', '.join(missing)}")
    return out
