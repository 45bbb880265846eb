"""The version and safety flags, their config-file keys, and start-up failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import build_parser, load_settings
from tests.server.policy_support import policy_document, write_policy

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_POLICY = REPO / "config" / "safety-policy.example.toml"


def test_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--upstream",
            "http://127.0.0.1:8000",
            "--tokenizer",
            "m.gguf",
            "--safety-policy",
            str(EXAMPLE_POLICY),
            "--enforce-safety-policy",
            "--version-policy",
            "strict",
            "--deployment-id",
            "prod-1",
            "--docs-url",
            "https://docs.example/up",
        ]
    )
    settings = load_settings(args)
    assert settings.safety_policy == EXAMPLE_POLICY
    assert settings.enforce_safety_policy is True
    assert settings.version_policy == "strict"
    assert settings.deployment_id == "prod-1"
    assert settings.docs_url == "https://docs.example/up"


def test_config_keys_and_defaults(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        'upstream = "http://x"\ntokenizer = "t"\n'
        f'safety_policy = "{EXAMPLE_POLICY}"\nversion_policy = "advisory"\n'
    )
    settings = load_settings(build_parser().parse_args(["serve", "--config", str(config)]))
    assert settings.safety_policy == EXAMPLE_POLICY
    assert settings.version_policy == "advisory"
    assert settings.enforce_safety_policy is False  # the flag was not given
    plain = load_settings(
        build_parser().parse_args(["serve", "--upstream", "http://u", "--tokenizer", "t"])
    )
    assert (plain.safety_policy, plain.enforce_safety_policy, plain.version_policy) == (
        None,
        False,
        "off",
    )


def test_example_config_documents_every_new_key() -> None:
    text = (REPO / "config" / "codec-proxy.example.toml").read_text()
    for key in (
        "safety_policy",
        "enforce_safety_policy",
        "version_policy",
        "deployment_id",
        "docs_url",
    ):
        assert f"{key} =" in text


def test_unknown_version_policy_is_rejected() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--version-policy", "maybe"])


def run_serve(smollm2_gguf: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:1",
         "--tokenizer", str(smollm2_gguf), "--port", "1", *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_enforcing_without_a_policy_fails_at_start(smollm2_gguf: Path) -> None:
    result = run_serve(smollm2_gguf, "--enforce-safety-policy")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "codec-proxy: enforce_safety_policy needs a safety policy file (safety_policy)"
    ]


def test_a_broken_policy_fails_at_start_without_quoting_rules(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    document = policy_document()
    document["rules"]["banned_ids"][0]["sequences"] = [[10**9]]  # not a SmolLM2 token ID
    path = write_policy(tmp_path, document)
    result = run_serve(smollm2_gguf, "--safety-policy", str(path))
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert str(path) in line
    assert "rules.banned_ids[0].sequences[0]" in line
    assert str(10**9) not in line
