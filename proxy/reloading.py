"""What a reload may change, and the settings a reload leaves a running process with (pure).

`RUNTIME_KEYS` and `RUNTIME_MODEL_KEYS` are the one list of what SIGHUP applies: the apply step
below reads them, docs/DEPLOY.md "Changes without restarts" lists them (a test keeps the two in
step). Every other setting is fixed for the life of the process: it was used to build what
cannot be swapped under requests in flight (the listening socket, the workers, tokenizers and
their maps, upstream pools, dictionaries, timeouts baked into connections).

`merge(running, new)` takes the running settings and copies in only the runtime keys of the
newly read ones; restart-only keys that differ are named, never applied, so a half-applied
configuration cannot exist.

`widenings(...)` says what a reload would let through that was refused before (the one list of
what counts as widening access, compression turned back on where it was left out among it), and
`unstated(...)` which of that comes only from a setting the configuration leaves out: a file cut
short or emptied must not drop keys, lists and policies as if the operator had meant it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Final

from proxy.settings import ModelSettings, Settings

# Top-level keys a reload applies.
RUNTIME_KEYS: Final[tuple[str, ...]] = (
    # rollout switches
    "codec_enabled",
    "codec_allow_keys",
    "codec_deny_keys",
    "codec_client_header",
    "codec_allow_clients",
    "codec_deny_clients",
    # local API keys
    "api_key",
    "api_key_file",
    "forward_authorization",
    # safety and version policy
    "safety_policy",
    "enforce_safety_policy",
    "version_policy",
    "deployment_id",
    "docs_url",
    # compressed streams' flush schedule
    "flush_interval_ms",
    "flush_frames",
    "merge_frames",
    # compressed JSON responses
    "json_compression",
    # responses left uncompressed
    "uncompressed",
    "uncompressed_keys",
    # continuous verification
    "verify_sample_rate",
    "verify_refuse_after",
    "verify_window",
    # process
    "log_level",
)

# Keys of a `models` entry a reload applies (to the running entry of the same name).
RUNTIME_MODEL_KEYS: Final[tuple[str, ...]] = (
    "codec_enabled",
    "flush_interval_ms",
    "flush_frames",
    "uncompressed",
)

# Files a reload reads again even when their path is unchanged: a key file rotated in place, a
# policy edited in place, take effect.
REREAD_FILES: Final[tuple[str, ...]] = ("api_key_file", "safety_policy")


@dataclass(frozen=True)
class Merged:
    """The settings a reload leads to, and how they differ from the running ones."""

    settings: Settings
    # Runtime keys whose value changed (`models[name].key` for a model's own).
    changed: tuple[str, ...]
    # Restart-only keys that differ in the new file; left as they were.
    needs_restart: tuple[str, ...]


def merge(running: Settings, new: Settings) -> Merged:
    """`running` with the runtime keys of `new`; models are matched by name."""
    runtime, changed, restart = _compare(running, new, RUNTIME_KEYS, models=_merge_models)
    return Merged(dataclasses.replace(running, **runtime), tuple(changed), tuple(restart))


# The values to apply, the runtime keys that changed, the other keys that differ.
Compared = tuple[Any, list[str], list[str]]


def _compare(
    running: Any,
    new: Any,
    runtime_keys: tuple[str, ...],
    *,
    prefix: str = "",
    **nested: Callable[[Any, Any], Compared],
) -> Compared:
    """One dataclass against another, in field order; a `nested` key is compared by its own
    function (the models, entry by entry), the others by value, named with `prefix`."""
    runtime: dict[str, Any] = {}
    changed: list[str] = []
    restart: list[str] = []
    for field in dataclasses.fields(running):
        key = field.name
        old_value, new_value = getattr(running, key), getattr(new, key)
        if key in nested:
            runtime[key], inner_changed, inner_restart = nested[key](old_value, new_value)
            changed += inner_changed
            restart += inner_restart
            continue
        if key in runtime_keys:
            runtime[key] = new_value
        if new_value != old_value:
            (changed if key in runtime_keys else restart).append(prefix + key)
    return runtime, changed, restart


def _merge_models(running: tuple[ModelSettings, ...], new: tuple[ModelSettings, ...]) -> Compared:
    by_name = {entry.name: entry for entry in new}
    running_names = {entry.name for entry in running}
    changed: list[str] = []
    restart = [f"models[{e.name}] (new)" for e in new if e.name not in running_names]
    merged = []
    for entry in running:
        fresh = by_name.get(entry.name)
        if fresh is None:
            restart.append(f"models[{entry.name}] (removed)")
            merged.append(entry)
            continue
        updates, model_changed, model_restart = _compare(
            entry, fresh, RUNTIME_MODEL_KEYS, prefix=f"models[{entry.name}]."
        )
        changed += model_changed
        restart += model_restart
        merged.append(dataclasses.replace(entry, **updates))
    # Without `default_model`, the first entry is the default: an order change moves it.
    common = [e.name for e in new if e.name in running_names]
    if common != [e.name for e in running if e.name in by_name]:
        restart.append("models (order)")
    return tuple(merged), changed, restart


# The settings local API keys come from.
_KEY_SOURCES: Final[tuple[str, ...]] = ("api_key", "api_key_file")


@dataclass(frozen=True)
class Widening:
    """One way a reload lets through what was refused before. Never names a key."""

    what: str
    # The settings it comes from (`models[name].key` for a model's own).
    settings: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.what} ({' and '.join(self.settings)})"


def widenings(
    running: Settings, running_keys: frozenset[str], new: Settings, new_keys: frozenset[str]
) -> tuple[Widening, ...]:
    """What `new` (with the API keys it reads) lets through that `running` refused: keys
    accepted or no longer needed, Codec for more requests, a policy or a floor gone."""
    found: list[Widening] = []

    def add(what: str, *settings: str) -> None:
        found.append(Widening(what, settings))

    if running_keys and not new_keys:
        sources = [name for name in _KEY_SOURCES if getattr(running, name)]
        add("every API key removed: no key needed", *sources)
    elif running_keys and (added := new_keys - running_keys):
        add(f"{_count(added, 'API key')} added", *[n for n in _KEY_SOURCES if getattr(new, n)])
    if new_keys and new.forward_authorization and not running.forward_authorization:
        add("clients' API keys sent upstream", "forward_authorization")
    if new.codec_enabled and not running.codec_enabled:
        add("Codec switched on", "codec_enabled")
    before = {entry.name: entry.codec_enabled for entry in running.models}
    for entry in new.models:
        if entry.codec_enabled and not before.get(entry.name, True):
            add(f"Codec switched on for model {entry.name}", f"models[{entry.name}].codec_enabled")
    for noun in ("key", "client"):
        allow, deny = f"codec_allow_{noun}s", f"codec_deny_{noun}s"
        _allow_list(add, allow, noun, getattr(running, allow), getattr(new, allow))
        _deny_list(add, deny, noun, getattr(running, deny), getattr(new, deny))
    header = running.codec_client_header
    if header is not None and running.codec_deny_clients and new.codec_client_header != header:
        add("denied clients named by another header", "codec_client_header")
    if running.safety_policy is not None and new.safety_policy is None:
        add("safety policy removed", "safety_policy")
    if running.enforce_safety_policy and not new.enforce_safety_policy:
        add("safety policy no longer enforced", "enforce_safety_policy")
    if running.version_policy == "strict" and new.version_policy != "strict":
        add("version floor no longer enforced", "version_policy")
    # Compression turned back on where it was left out: a protection gone (BREACH).
    if running.uncompressed and not new.uncompressed:
        add("responses compressed again", "uncompressed")
    before_models = {entry.name: entry.uncompressed for entry in running.models}
    for entry in new.models:
        now = new.uncompressed if entry.uncompressed is None else entry.uncompressed
        if before_models.get(entry.name) and not now:
            add(f"responses of model {entry.name} compressed again",
                f"models[{entry.name}].uncompressed")  # fmt: skip
    if removed := set(running.uncompressed_keys) - set(new.uncompressed_keys):
        add(f"responses to {_count(removed, 'key')} compressed again", "uncompressed_keys")
    return tuple(found)


def unstated(found: Iterable[Widening], stated: Collection[str] | None) -> tuple[Widening, ...]:
    """The widenings that come from a setting the configuration does not state, which took its
    default (`stated` as `proxy.config.Loaded` gives it; None: everything is meant)."""
    if stated is None:
        return ()
    return tuple(w for w in found if any(name not in stated for name in w.settings))


def _allow_list(
    add: Callable[..., None], name: str, noun: str, before: tuple[str, ...], after: tuple[str, ...]
) -> None:
    if not before:
        return  # everyone was allowed already
    if not after:
        add(f"allow-list emptied: every {noun} gets Codec", name)
    elif added := set(after) - set(before):
        add(f"{_count(added, noun)} added to the allow-list", name)


def _deny_list(
    add: Callable[..., None], name: str, noun: str, before: tuple[str, ...], after: tuple[str, ...]
) -> None:
    if not after and before:
        add("deny-list emptied", name)
    elif removed := set(before) - set(after):
        add(f"{_count(removed, noun)} removed from the deny-list", name)


def _count(items: Collection[str], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
