"""The command line: settings from a file and flags, and clear one-line failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import build_parser, check_config, load_settings

REPO = Path(__file__).resolve().parent.parent


def test_example_config_loads_and_flags_override_it() -> None:
    args = build_parser().parse_args(
        ["serve", "--config", str(REPO / "config" / "codec-proxy.example.toml"), "--port", "9999"]
    )
    settings = load_settings(args)
    assert settings.upstream == ("http://127.0.0.1:8000",)
    assert settings.port == 9999
    assert settings.max_event_bytes == 1 << 20


def test_unknown_config_key_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('upstream = "http://x"\ntokenizer = "t"\nportt = 1\n')
    args = build_parser().parse_args(["serve", "--config", str(config)])
    with pytest.raises(SystemExit, match=r"bad\.toml: unknown key 'portt'"):
        load_settings(args)


def test_token_ids_flag_config_and_default(tmp_path: Path) -> None:
    example = str(REPO / "config" / "codec-proxy.example.toml")
    args = build_parser().parse_args(["serve", "--config", example])
    assert load_settings(args).token_ids == "auto"
    args = build_parser().parse_args(["serve", "--config", example, "--token-ids", "retokenize"])
    assert load_settings(args).token_ids == "retokenize"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--token-ids", "sometimes"])
    config = tmp_path / "bad.toml"
    config.write_text('upstream = "http://x"\ntokenizer = "t"\ntoken_ids = "sometimes"\n')
    with pytest.raises(
        SystemExit, match="'token_ids' must be one of 'auto', 'backend', 'retokenize'"
    ):
        load_settings(build_parser().parse_args(["serve", "--config", str(config)]))


def test_missing_upstream_is_reported() -> None:
    args = build_parser().parse_args(["serve", "--tokenizer", "x.gguf"])
    with pytest.raises(SystemExit, match="'upstream' is required: pass --upstream"):
        load_settings(args)


@pytest.mark.parametrize("runner", [["-m", "proxy"]])
def test_bad_tokenizer_fails_at_start_with_one_line(tmp_path: Path, runner: list[str]) -> None:
    missing = tmp_path / "nope.gguf"
    result = subprocess.run(
        [
            sys.executable,
            *runner,
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--tokenizer",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(missing) in lines[0]


def test_vocab_handshake_flags() -> None:
    args = build_parser().parse_args(
        ["serve", "--upstream", "http://x", "--tokenizer", "t.gguf", "--map-id", "org/model",
         "--drift-check", "off", "--drift-check-interval", "60"]
    )  # fmt: skip
    settings = load_settings(args)
    assert (settings.map_id, settings.drift_check, settings.drift_check_interval) == (
        "org/model",
        False,
        60.0,
    )
    defaults = load_settings(
        build_parser().parse_args(["serve", "--upstream", "http://x", "--tokenizer", "t.gguf"])
    )
    assert (defaults.map_id, defaults.drift_check, defaults.drift_check_interval) == (
        None,
        True,
        300.0,
    )


def test_drift_check_in_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('upstream = "http://x"\ntokenizer = "t"\ndrift_check = "off"\n')
    assert (
        load_settings(build_parser().parse_args(["serve", "--config", str(config)])).drift_check
        is False
    )
    config.write_text('upstream = "http://x"\ntokenizer = "t"\ndrift_check = "maybe"\n')
    with pytest.raises(
        SystemExit, match=r"'drift_check' must be true or false \(or on/off\), got 'maybe'"
    ):
        load_settings(build_parser().parse_args(["serve", "--config", str(config)]))


def test_an_unpublishable_map_id_fails_at_start_with_one_line(smollm2_gguf: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:1",
         "--tokenizer", str(smollm2_gguf), "--map-id", "Org/../Model"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "codec-proxy: map id 'Org/../Model' must be lowercase ASCII letters, digits "
        "and . _ / - only"
    ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_key_file_without_keys_stops_the_start_with_one_line(
    tmp_path: Path, smollm2_gguf: Path, workers: str
) -> None:
    """Before the tokenizers and the workers: with `--workers 2` too, one line and an exit,
    never a worker restarted again and again, and never a proxy without its keys."""
    keys = tmp_path / "keys"
    keys.write_text("# the Secret was mounted empty\n\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:1",
         "--tokenizer", str(smollm2_gguf), "--api-key-file", str(keys), "--port", "0",
         "--workers", workers],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "codec-proxy: 'api_key_file' holds no API key (only blank lines or # comments); an "
        "empty key file never turns authentication off"
    ]
    assert result.stdout == ""  # nothing started


def test_check_config_reads_the_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("")
    file = tmp_path / "c.toml"
    file.write_text(f'upstream = "http://x"\ntokenizer = "{tmp_path}"\napi_key_file = "{keys}"\n')
    args = build_parser().parse_args(["check-config", str(file)])
    assert check_config(args) == 2
    assert capsys.readouterr().err.startswith("codec-proxy: 'api_key_file' holds no API key")
    keys.write_text("k\n")
    assert check_config(args) == 0


SECRET = "sk-live-4b9f8e21"
# PyYAML quotes the line at fault whole: the key, unless the proxy leaves it out.
BROKEN_YAML = f'upstream: http://x\ntokenizer: t\napi_key: "{SECRET}\n'


def test_check_config_never_prints_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(BROKEN_YAML)
    assert check_config(build_parser().parse_args(["check-config", str(file)])) == 2
    err = capsys.readouterr().err
    assert err == (
        f"codec-proxy: {file}: not valid YAML: found unexpected end of stream "
        "(at line 4, column 1)\n"
    )
    file.write_text(f"upstream: http://x\ntokenizer: {tmp_path}\napi_key: [{SECRET}]\n")
    assert check_config(build_parser().parse_args(["check-config", str(file)])) == 0
    out = capsys.readouterr().out
    assert "api_key = '<redacted>'" in out.splitlines()
    assert SECRET not in out


def test_a_config_error_at_start_never_prints_a_secret(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(BROKEN_YAML)
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(file)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"codec-proxy: {file}: not valid YAML: found unexpected end of stream (at line 4, column 1)"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api-keys", SECRET, "--prot=5"], "unrecognized arguments: --api-keys --prot and 1 "
         "word(s) not shown (a key may be among them)"),
        ([f"--api_key={SECRET}"], "unrecognized arguments: --api_key"),
        ([SECRET], "unrecognized arguments: 1 word(s) not shown (a key may be among them)"),
        ([f"--api={SECRET}"], "ambiguous option: --api could match --api-key, --api-key-file"),
    ],
)  # fmt: skip
def test_a_flag_the_parser_does_not_know_is_named_without_what_follows(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream", "http://x", "--tokenizer", "t", *argv])
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(f"error: {message}")
    assert SECRET not in err
