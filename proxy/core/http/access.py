"""Who gets Codec: the rollout switches, decided before any upstream contact.

Codec is on for every client that asks unless the operator narrows it: off everywhere, off for
one model, only for some API keys or client names (allow-lists), never for others
(deny-lists). A deny always wins; an empty allow-list allows everyone. JSON requests never come
here: rolling Codec out must not change what a JSON client gets.

A refused Codec request gets one stable answer, 403 `codec_not_enabled` (docs/ROLLOUT.md): it
is not a 426 (the reference clients parse a 426 body as a version demand, and no upgrade would
help), not a 404 on Path B (the spec's "fall back to Path A", which would be refused too), and
never a JSON stream in place of frames (a Codec client would try to decode it as frames). The
client repeats the request without `stream_format`, as JSON.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from proxy.core.errors import Forbidden

CODEC_NOT_ENABLED: Final = "codec_not_enabled"
# What a client should do, in every refusal: the same words, so they can be documented.
_ADVICE: Final = "repeat the request without stream_format to receive JSON"


class CodecNotEnabled(Forbidden):
    """This client may not have Codec here (403); JSON is still served. `reason` says which
    switch refused it, for metrics and logs; clients see only the code."""

    def __init__(self, reason: str, what: str) -> None:
        super().__init__(
            f"Codec streams are not enabled {what}; {_ADVICE}",
            code=CODEC_NOT_ENABLED,
            public=True,
            param="stream_format",
        )
        self.reason = reason


def _matches(value: str, patterns: Sequence[str]) -> bool:
    """Exact names, or a prefix where a pattern ends in `*` (`my-app/*`)."""
    return any(value.startswith(p[:-1]) if p.endswith("*") else value == p for p in patterns)


def has_key(key: str, keys: Sequence[str]) -> bool:
    # Every key compared, in constant time: how long this takes says nothing of the keys.
    presented = key.encode()
    return any([hmac.compare_digest(presented, k.encode()) for k in keys])


@dataclass(frozen=True)
class CodecAccess:
    """The rollout switches, as the settings give them."""

    enabled: bool = True
    allow_keys: tuple[str, ...] = ()
    deny_keys: tuple[str, ...] = ()
    allow_clients: tuple[str, ...] = ()
    deny_clients: tuple[str, ...] = ()

    def refusal_for_all(self, *, model: str, model_enabled: bool) -> CodecNotEnabled | None:
        """The refusal every client of this model gets, whoever it is (Codec off on this
        server or for this model); None when it depends on the client at most. What
        `/codec/version` says of a model (core/http/server_version.py)."""
        if not self.enabled:
            return CodecNotEnabled("disabled", "on this server")
        if not model_enabled:
            return CodecNotEnabled("model_disabled", f"for model {model!r}")
        return None

    def check(self, *, model: str, model_enabled: bool, key: str, client: str | None) -> None:
        """Raise `CodecNotEnabled` when this request may not have Codec.

        `key` is the Bearer token the client sent ("" without one); `client` the value of the
        configured client header (None when none is configured or the header is absent).
        """
        refusal = self.refusal_for_all(model=model, model_enabled=model_enabled)
        if refusal is not None:
            raise refusal
        if self.deny_keys and key and has_key(key, self.deny_keys):
            raise CodecNotEnabled("key_denied", "for this API key")
        if self.allow_keys and not (key and has_key(key, self.allow_keys)):
            raise CodecNotEnabled("key_not_allowed", "for this API key")
        if self.deny_clients and client is not None and _matches(client, self.deny_clients):
            raise CodecNotEnabled("client_denied", "for this client")
        if self.allow_clients and not (client is not None and _matches(client, self.allow_clients)):
            raise CodecNotEnabled("client_not_allowed", "for this client")
