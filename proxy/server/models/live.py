"""What a reload can change, as one snapshot; every request keeps the one it started with.

`Live` bundles the settings and everything derived from them that a running proxy may swap
(SIGHUP, proxy/server/process/reload.py): the rollout switches, API keys, safety and version policy,
flush settings, the log level. A request takes the current snapshot once, when it arrives
(`take_snapshot`, called by the edge's middleware), and reads it for its whole life, so a
stream in flight keeps the settings it started with whatever is reloaded meanwhile. What
cannot change at run time (listen address, workers, models and their tokenizers and upstreams)
is built once, at start, from the first snapshot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from proxy.core.errors import ConfigError
from proxy.core.http.access import CodecAccess
from proxy.core.http.uncompressed import uncompressed
from proxy.core.http.upgrade import VersionPolicy
from proxy.core.safety.policy import SafetyPolicy
from proxy.server.models.policy_file import read_policy_file
from proxy.settings import ModelConfig, Settings
from proxy.tokenizers.vocabulary import Vocabulary


@dataclass(frozen=True)
class Live:
    """The settings in force, and what is built from them. One per (re)load."""

    settings: Settings
    models: Mapping[str, ModelConfig]
    version_policy: VersionPolicy
    # Compiled against each model's tokenizer (banned IDs and strings are a vocabulary's).
    safety_policies: Mapping[str, SafetyPolicy]
    api_keys: frozenset[str]
    access: CodecAccess
    # 0 for the configuration read at start, then one more per applied reload.
    generation: int = 0

    @property
    def forward_authorization(self) -> bool:
        """Whether the client's Authorization header goes upstream
        (proxy/server/control/auth.py)."""
        return not self.api_keys or self.settings.forward_authorization

    def model(self, name: str) -> ModelConfig:
        return self.models[name]

    def uncompressed(self, model: str, key: str) -> bool:
        """Whether `model`'s responses to the Bearer token `key` go uncompressed
        (core/http/uncompressed.py)."""
        return uncompressed(
            model=self.model(model).uncompressed, key=key, keys=self.settings.uncompressed_keys
        )

    def safety_policy(self, model: str) -> SafetyPolicy | None:
        return self.safety_policies.get(model)


def build_live(
    settings: Settings, vocabularies: Mapping[str, Vocabulary], *, generation: int = 0
) -> Live:
    """Everything checked and built before anything is swapped in: `ConfigError` (and the
    safety policy's and key file's own errors) when the settings cannot be used."""
    if settings.enforce_safety_policy and settings.safety_policy is None:
        raise ConfigError("enforce_safety_policy needs a safety policy file (safety_policy)")
    version_policy = VersionPolicy(
        mode=settings.version_policy,
        enforce_safety_policy=settings.enforce_safety_policy,
        deployment_id=settings.deployment_id,
        docs_url=settings.docs_url,
    )
    models = {model.name: model for model in settings.model_list()}
    policies: dict[str, SafetyPolicy] = {}
    if settings.safety_policy is not None:
        compiled: dict[int, SafetyPolicy] = {}  # one compile per distinct tokenizer
        for name in models:
            vocabulary = vocabularies[name]
            policy = compiled.get(id(vocabulary))
            if policy is None:
                policy = read_policy_file(settings.safety_policy, vocabulary.loaded)
                compiled[id(vocabulary)] = policy
            policies[name] = policy
    api_keys = settings.api_keys()
    access = CodecAccess(
        enabled=settings.codec_enabled,
        allow_keys=settings.codec_allow_keys,
        deny_keys=settings.codec_deny_keys,
        allow_clients=settings.codec_allow_clients,
        deny_clients=settings.codec_deny_clients,
    )
    return Live(settings, models, version_policy, policies, api_keys, access, generation)


class LiveConfig:
    """The current snapshot; replaced whole, never edited."""

    def __init__(self, live: Live) -> None:
        self.current = live

    def swap(self, live: Live) -> None:
        self.current = dataclasses.replace(live, generation=self.current.generation + 1)


LIVE = web.AppKey("live", LiveConfig)
CONFIG = web.RequestKey("config", Live)


def take_snapshot(request: web.Request) -> None:
    """Keep the current snapshot on `request`, as it arrives: the one it reads from now on."""
    request[CONFIG] = request.app[LIVE].current


def config_of(request: web.Request) -> Live:
    """The snapshot `request` started with."""
    return request[CONFIG]
