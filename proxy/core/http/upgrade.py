"""The two-stage version capability: when a Codec request gets 426, and what 426 says.

codec-spec.md §6: every capability is off by default and has two stages. *Enable* offers the
v0.4 features to v0.4+ clients only; *enforce* answers clients below the floor with 426 Upgrade
Required, before the upstream is contacted. "A v0.4 server with NO mandatory features MUST NOT
emit 426 for version mismatches alone": with nothing enforced, `refuses()` is always false.

The 426 body and `/.well-known/codec/version-policy.json` are built from the same terms, so they
cannot disagree ("a divergence between the well-known doc and the runtime 426 is a deployment
bug", v0.4 § Version Compatibility Signaling).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from proxy.core.errors import ConfigError, UpgradeRequired
from proxy.core.http.versioning import V0_4, ClientVersion

VersionPolicyMode = Literal["off", "advisory", "strict"]
VERSION_POLICY_MODES: tuple[str, ...] = get_args(VersionPolicyMode)

# The only v0.4 floor there is; `Codec-Min-Version` and `Upgrade` name it.
MINIMUM_VERSION = V0_4
# The closed per-minor feature enum (codec-spec.md §4, `Codec-Required-Features`). Header
# values are built only from these constants, never from configuration text, so no
# configuration can inject CRLF into a header (v0.5-scope threat list).
SAFETY_POLICY_ENFORCEMENT = "safety-policy-enforcement"

_JSON = "application/json"


@dataclass(frozen=True)
class VersionPolicy:
    """What this deployment enforces. Built once from the settings.

    `mode`: `off` enforces nothing; `advisory` serves every client but lets the edge log the
    ones below the floor (the reference engines' "header set but no 426"); `strict` answers
    them 426. `enforce_safety_policy` is the safety capability's enforce stage: it also
    answers 426, listing `safety-policy-enforcement`.
    """

    mode: VersionPolicyMode = "off"
    enforce_safety_policy: bool = False
    deployment_id: str | None = None
    docs_url: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in VERSION_POLICY_MODES:
            raise ConfigError(
                f"version_policy must be one of {', '.join(VERSION_POLICY_MODES)}, "
                f"not {self.mode!r}"
            )
        for name in ("deployment_id", "docs_url"):
            value = getattr(self, name)
            if value is not None and (not value or not value.isprintable()):
                raise ConfigError(f"{name} must be non-empty printable text")
        if self.docs_url is not None and not self.docs_url.startswith(("https://", "http://")):
            raise ConfigError("docs_url must be an http(s) URL")

    @property
    def enforced(self) -> bool:
        """Whether any capability is at its enforce stage."""
        return self.mode == "strict" or self.enforce_safety_policy

    @property
    def required_features(self) -> tuple[str, ...]:
        # Strict mode alone mandates the version, not a feature: the list is then empty, as
        # the reference engines send it (interop.md §2.4).
        return (SAFETY_POLICY_ENFORCEMENT,) if self.enforce_safety_policy else ()

    def refuses(self, client: ClientVersion) -> bool:
        """Whether a Codec request from this client gets 426."""
        return self.enforced and client < MINIMUM_VERSION

    def advises(self, client: ClientVersion) -> bool:
        """Advisory mode: the client is below the floor but is served (the edge logs it)."""
        return self.mode == "advisory" and not self.enforced and client < MINIMUM_VERSION

    def _terms(self) -> dict[str, Any]:
        terms: dict[str, Any] = {
            "minimum_version": str(MINIMUM_VERSION),
            "required_features": list(self.required_features),
        }
        if self.deployment_id is not None:
            terms["deployment_id"] = self.deployment_id
        if self.docs_url is not None:
            terms["docs_url"] = self.docs_url
        return terms

    def document(self) -> bytes | None:
        """`/.well-known/codec/version-policy.json`, or None when nothing is enforced.

        "A deployment without mandatory features SHOULD NOT publish this document" (WKD).
        `valid_until` is optional and not configured: clients then cache it for an hour.
        """
        if not self.enforced:
            return None
        return _dump(self._terms())

    def upgrade_required(self, client: ClientVersion) -> UpgradeRequired:
        """The 426 for this client (codec-spec.md §6, §12 item 24)."""
        body = {"error": "codec_version_required", **self._terms(), "client_version": str(client)}
        headers = [
            ("Content-Type", _JSON),
            ("Codec-Min-Version", str(MINIMUM_VERSION)),
            # RFC 9110 §15.5.22: a 426 names the protocol to upgrade to.
            ("Upgrade", f"Codec/{MINIMUM_VERSION}"),
            # The answer depends on the version header: caches must key on it (v0.6-wire §2.2).
            ("Vary", "Codec-Client-Version"),
        ]
        if self.required_features:
            # Comma-space, as in the spec example; omitted when empty (no empty header value).
            headers.append(("Codec-Required-Features", ", ".join(self.required_features)))
        return UpgradeRequired(
            f"Codec client version {client} is below the required {MINIMUM_VERSION}",
            headers=tuple(headers),
            body=_dump(body),
        )


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
