"""What a reload may change, and the settings a reload leaves a running process with (pure).

`RUNTIME_KEYS` and `RUNTIME_MODEL_KEYS` are the one list of what SIGHUP applies: the apply step
below reads them, docs/DEPLOY.md "Changes without restarts" lists them (a test keeps the two in
step). Every other setting is fixed for the life of the process: it was used to build what
cannot be swapped under requests in flight (the listening socket, the workers, tokenizers and
their maps, upstream pools, dictionaries, timeouts baked into connections).

`merge(running, new)` takes the running settings and copies in only the runtime keys of the
newly read ones; restart-only keys that differ are named, never applied, so a half-applied
configuration cannot exist.
"""

from __future__ import annotations

import dataclasses
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
    # continuous verification
    "verify_sample_rate",
    "verify_refuse_after",
    "verify_window",
    # process
    "log_level",
)

# Keys of a `models` entry a reload applies (to the running entry of the same name).
RUNTIME_MODEL_KEYS: Final[tuple[str, ...]] = ("codec_enabled", "flush_interval_ms", "flush_frames")

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
    changed: list[str] = []
    restart: list[str] = []
    runtime: dict[str, Any] = {}
    for field in dataclasses.fields(Settings):
        name = field.name
        old_value, new_value = getattr(running, name), getattr(new, name)
        if name in RUNTIME_KEYS:
            runtime[name] = new_value
            if new_value != old_value:
                changed.append(name)
        elif name == "models":
            models, model_changed, model_restart = _merge_models(running.models, new.models)
            runtime[name] = models
            changed += model_changed
            restart += model_restart
        elif new_value != old_value:
            restart.append(name)
    return Merged(dataclasses.replace(running, **runtime), tuple(changed), tuple(restart))


def _merge_models(
    running: tuple[ModelSettings, ...], new: tuple[ModelSettings, ...]
) -> tuple[tuple[ModelSettings, ...], list[str], list[str]]:
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
        updates = {}
        for field in dataclasses.fields(ModelSettings):
            key = field.name
            old_value, new_value = getattr(entry, key), getattr(fresh, key)
            if key in RUNTIME_MODEL_KEYS:
                updates[key] = new_value
                if new_value != old_value:
                    changed.append(f"models[{entry.name}].{key}")
            elif new_value != old_value:
                restart.append(f"models[{entry.name}].{key}")
        merged.append(dataclasses.replace(entry, **updates))
    # Without `default_model`, the first entry is the default: an order change moves it.
    common = [e.name for e in new if e.name in running_names]
    if common != [e.name for e in running if e.name in by_name]:
        restart.append("models (order)")
    return tuple(merged), changed, restart
