"""The two-stage capability: when 426 is due and what it and the version policy say."""

from __future__ import annotations

import json

import pytest

from proxy.core.errors import ConfigError
from proxy.core.http.upgrade import SAFETY_POLICY_ENFORCEMENT, VersionPolicy
from proxy.core.http.versioning import ClientVersion, parse_client_version

CLIENTS = [None, "", "garbage", "0.0", "0.2", "0.3", "0.4", "v0.4.1", "0.5", "1.0"]


def _refused(policy: VersionPolicy) -> set[str | None]:
    return {h for h in CLIENTS if policy.refuses(parse_client_version(h).version)}


def test_nothing_enforced_never_refuses() -> None:
    for policy in (VersionPolicy(), VersionPolicy(mode="off"), VersionPolicy(mode="advisory")):
        assert not policy.enforced
        assert _refused(policy) == set()
        assert policy.document() is None


def test_advisory_notes_old_clients_without_refusing() -> None:
    policy = VersionPolicy(mode="advisory")
    assert policy.advises(ClientVersion(0, 3))
    assert not policy.advises(ClientVersion(0, 4))
    assert not VersionPolicy().advises(ClientVersion(0, 3))


@pytest.mark.parametrize(
    "policy",
    [VersionPolicy(mode="strict"), VersionPolicy(enforce_safety_policy=True)],
    ids=["strict", "enforce-safety"],
)
def test_enforced_refuses_exactly_the_clients_below_0_4(policy: VersionPolicy) -> None:
    assert policy.enforced
    assert _refused(policy) == {None, "", "garbage", "0.0", "0.2", "0.3"}


def test_426_with_safety_enforcement() -> None:
    policy = VersionPolicy(
        enforce_safety_policy=True, deployment_id="acme-prod-1", docs_url="https://d.example/up"
    )
    error = policy.upgrade_required(ClientVersion(0, 3))
    assert error.status_hint == 426
    headers = dict(error.headers)
    assert headers["Codec-Min-Version"] == "0.4"
    assert headers["Codec-Required-Features"] == SAFETY_POLICY_ENFORCEMENT
    assert headers["Upgrade"] == "Codec/0.4"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(error.body) == {
        "error": "codec_version_required",
        "minimum_version": "0.4",
        "required_features": ["safety-policy-enforcement"],
        "client_version": "0.3",
        "deployment_id": "acme-prod-1",
        "docs_url": "https://d.example/up",
    }


def test_426_in_strict_mode_lists_no_feature() -> None:
    error = VersionPolicy(mode="strict").upgrade_required(parse_client_version(None).version)
    assert "Codec-Required-Features" not in dict(error.headers)
    body = json.loads(error.body)
    assert body["required_features"] == []
    assert body["client_version"] == "0.2"  # absent is treated as, and echoed as, 0.2
    assert "deployment_id" not in body
    assert "docs_url" not in body


@pytest.mark.parametrize(
    "policy",
    [
        VersionPolicy(mode="strict"),
        VersionPolicy(enforce_safety_policy=True, deployment_id="d-1"),
        VersionPolicy(mode="strict", enforce_safety_policy=True, docs_url="https://x.example"),
    ],
)
def test_version_policy_document_agrees_with_the_426(policy: VersionPolicy) -> None:
    document = policy.document()
    assert document is not None
    body = json.loads(policy.upgrade_required(ClientVersion(0, 0)).body)
    assert json.loads(document) == {
        k: v for k, v in body.items() if k not in ("error", "client_version")
    }


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "sometimes"},
        {"deployment_id": ""},
        {"deployment_id": "prod\r\nX-Injected: 1"},
        {"docs_url": "ftp://example.com"},
        {"docs_url": "https://example.com/\n"},
    ],
)
def test_bad_configuration_is_refused(changes: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        VersionPolicy(**changes)  # type: ignore[arg-type]
