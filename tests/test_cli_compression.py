"""Compression settings on the command line, and refusing to start on a bad dictionary."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import build_parser, load_settings
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST

REPO = Path(__file__).resolve().parent.parent


def test_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--upstream",
            "http://x",
            "--tokenizer",
            "t.gguf",
            "--flush-interval-ms",
            "25",
            "--flush-frames",
            "8",
            "--merge-frames",
            "off",
            "--zstd-dict",
            "msgpack=/a.zstd",
            "--zstd-dict",
            "protobuf=/b.zstd",
            "--dictionaries-manifest",
            "none",
        ]
    )
    settings = load_settings(args)
    assert settings.flush_interval_ms == 25.0
    assert settings.flush_frames == 8
    assert settings.merge_frames is False
    assert settings.zstd_dicts == ("msgpack=/a.zstd", "protobuf=/b.zstd")
    assert settings.dictionaries_manifest is None


def test_defaults_load_the_shipped_manifest() -> None:
    args = build_parser().parse_args(["serve", "--upstream", "http://x", "--tokenizer", "t"])
    settings = load_settings(args)
    assert settings.dictionaries_manifest == DEFAULT_DICTIONARIES_MANIFEST
    assert settings.merge_frames is True
    assert settings.flush_interval_ms > 0


def test_example_config_keys_are_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--config", str(REPO / "config" / "codec-proxy.example.toml")]
    )
    settings = load_settings(args)
    assert settings.flush_frames > 1
    assert settings.zstd_dicts == ()


def serve(smollm2_gguf: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--tokenizer",
            str(smollm2_gguf),
            "--port",
            "1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("tamper", ["dictionary", "manifest-hash"])
def test_mismatched_dictionary_refuses_to_start_with_one_line(
    tmp_path: Path, smollm2_gguf: Path, tamper: str
) -> None:
    shipped = DEFAULT_DICTIONARIES_MANIFEST.parent
    target = tmp_path / "dicts"
    shutil.copytree(shipped, target, ignore=shutil.ignore_patterns("corpus"))
    manifest = target / "manifest.json"
    if tamper == "dictionary":
        victim = next(target.glob("*msgpack*.zstd"))
        victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    else:
        text = manifest.read_text()
        first = text.index('"sha256": "') + len('"sha256": "')
        manifest.write_text(text[:first] + "0" * 64 + text[first + 64 :])
    result = serve(smollm2_gguf, "--dictionaries-manifest", str(manifest))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "does not match its manifest" in lines[0]
    assert "refusing to start" in lines[0]


def test_missing_named_manifest_refuses_to_start(tmp_path: Path, smollm2_gguf: Path) -> None:
    result = serve(smollm2_gguf, "--dictionaries-manifest", str(tmp_path / "nope.json"))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "cannot read dictionary manifest" in lines[0]
