"""Policy documents for tests, built the way an operator writes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.core.safety.descriptor import parse_descriptor
from proxy.core.safety.rules import CompiledRules, Vocab, compile_rules

# A toy vocabulary for matcher tests that need no real tokenizer: IDs below 1000, and the
# placeholder text is its IDs spelled out.
TOY_VOCAB = Vocab(
    size=1000,
    encode=lambda text: [ord(c) % 1000 for c in text],
    decode=lambda ids: "".join(f"<{i}>" for i in ids),
)


def descriptor(**categories: str) -> dict[str, Any]:
    return {
        "id": "test/policy-v1",
        "version": "1",
        "tokenizers": ["test/tokenizer"],
        "categories": [{"name": name, "action": action} for name, action in categories.items()],
        "classifier": {"family": "none"},
    }


def document(
    *,
    stop_strings: Sequence[str] = (),
    redact_strings: Sequence[str] = (),
    stop_ids: Sequence[Sequence[int]] = (),
    redact_ids: Sequence[Sequence[int]] = (),
    stop_regexes: Sequence[tuple[str, int]] = (),
    redact_regexes: Sequence[tuple[str, int]] = (),
    placeholder: str | list[int] = "[X]",
) -> dict[str, Any]:
    """A policy with a `stop` category and a `redact` category holding the given rules."""
    rules: dict[str, Any] = {"banned_ids": [], "banned_strings": [], "regexes": []}
    used = set()
    for category, strings, ids, regexes in (
        ("halt", stop_strings, stop_ids, stop_regexes),
        ("mask", redact_strings, redact_ids, redact_regexes),
    ):
        if strings:
            rules["banned_strings"].append({"category": category, "strings": list(strings)})
        if ids:
            rules["banned_ids"].append({"category": category, "sequences": [list(s) for s in ids]})
        for pattern, max_length in regexes:
            rules["regexes"].append(
                {"category": category, "pattern": pattern, "max_length": max_length}
            )
        if strings or ids or regexes:
            used.add(category)
    actions = {"halt": "stop", "mask": "redact"}
    if "mask" in used:
        rules["placeholders"] = {"mask": placeholder}
    return {
        "descriptor": descriptor(**{c: actions[c] for c in sorted(used)}),
        "rules": rules,
    }


def compiled(vocab: Vocab = TOY_VOCAB, **rules: Any) -> CompiledRules:
    doc = document(**rules)
    return compile_rules(doc["rules"], parse_descriptor(doc["descriptor"]), vocab)
