"""`codec-proxy reload`: check the file, find the process, signal it; the pid file; the merge."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy import cli, pidfile
from proxy.config import ConfigSource, setting_names
from proxy.reloading import RUNTIME_KEYS, RUNTIME_MODEL_KEYS, merge
from proxy.settings import ModelSettings, Settings

# Exits 7 on SIGHUP, whatever the disposition it inherited.
HANGUP_CATCHER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGHUP, lambda *_: sys.exit(7))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def target() -> Iterator[subprocess.Popen[str]]:
    """A process that tells whether it got a SIGHUP (exit status 7)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGUP_CATCHER], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    proc.stdout.close()


def run_reload(*argv: str) -> int:
    return cli.reload(cli.build_parser().parse_args(["reload", *argv]))


@pytest.fixture(autouse=True)
def no_pid_file_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEC_PROXY_PID_FILE", raising=False)


def test_reload_signals_the_process_of_the_pid_file(
    target: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_path = tmp_path / "codec-proxy.pid"
    pid_path.write_text(f"{target.pid}\n")
    assert run_reload("--pid-file", str(pid_path)) == 0
    assert target.wait(10) == 7
    assert f"sent SIGHUP to {target.pid}" in capsys.readouterr().out


def test_an_invalid_config_is_reported_and_nothing_is_signalled(
    target: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "codec-proxy.toml"
    config.write_text('upstream = "http://x"\ntokenizer = "t"\nflush_frames = -1\n')
    assert run_reload("--pid", str(target.pid), "--config", str(config)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"codec-proxy: {config}: 'flush_frames' must be >= 0, got -1 (nothing signalled)"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        target.wait(0.3)  # still running: not signalled
    # Fixed, it is signalled, and the file's own pid_file finds the process.
    pid_path = tmp_path / "codec-proxy.pid"
    pid_path.write_text(f"{target.pid}\n")
    config.write_text(f'upstream = "http://x"\ntokenizer = "t"\npid_file = "{pid_path}"\n')
    assert run_reload("--config", str(config)) == 0
    assert target.wait(10) == 7


def test_no_process_to_signal_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_reload() == 1
    assert capsys.readouterr().err == (
        "codec-proxy: no process to signal: pass --pid-file or --pid (or set pid_file)\n"
    )
    missing = tmp_path / "none.pid"
    assert run_reload("--pid-file", str(missing)) == 1
    assert capsys.readouterr().err.startswith(f"codec-proxy: cannot read pid file {missing}: ")
    garbage = tmp_path / "garbage.pid"
    garbage.write_text("not a pid\n")
    assert run_reload("--pid-file", str(garbage)) == 1
    assert "does not hold a process id" in capsys.readouterr().err
    # A process that has exited: the pid file is stale.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / "stale.pid"
    stale.write_text(f"{gone.pid}\n")
    assert run_reload("--pid-file", str(stale)) == 1
    assert capsys.readouterr().err == (
        f"codec-proxy: no process {gone.pid} (stale pid file {stale})\n"
    )


def test_the_pid_file_is_written_and_removed_only_when_still_ours(tmp_path: Path) -> None:
    path = tmp_path / "run" / "codec-proxy.pid"
    path.parent.mkdir()
    with pidfile.written(path):
        assert pidfile.read(path) == os.getpid()
        assert [p.name for p in path.parent.iterdir()] == ["codec-proxy.pid"]
    assert not path.exists()
    with pidfile.written(path):
        path.write_text("1\n")  # another process took it over
    assert path.read_text() == "1\n"
    with pidfile.written(None):
        pass


# --------------------------------------------------------------------------- the one list


def test_every_runtime_key_is_a_setting() -> None:
    assert set(RUNTIME_KEYS) <= set(setting_names())
    assert len(set(RUNTIME_KEYS)) == len(RUNTIME_KEYS)
    model_fields = {f.name for f in dataclasses.fields(ModelSettings)}
    assert set(RUNTIME_MODEL_KEYS) <= model_fields
    # The per-model overrides of runtime keys are runtime keys themselves.
    overrides = {"codec_enabled", "flush_interval_ms", "flush_frames", "uncompressed"}
    assert overrides <= set(RUNTIME_KEYS)
    assert overrides == set(RUNTIME_MODEL_KEYS)


def test_merge_takes_only_runtime_keys_from_the_new_settings() -> None:
    running = Settings(upstream=("http://a",), tokenizer=Path("a.gguf"))
    new = Settings(
        upstream=("http://b",),
        tokenizer=Path("b.gguf"),
        port=1,
        max_streams=2,
        codec_enabled=False,
        codec_deny_keys=("k",),
        version_policy="strict",
        flush_frames=3,
        verify_sample_rate=0.5,
        log_level="DEBUG",
    )
    merged = merge(running, new)
    for name in setting_names():
        expected = getattr(new if name in RUNTIME_KEYS else running, name)
        assert getattr(merged.settings, name) == expected, name
    assert merged.changed == (
        "version_policy",
        "flush_frames",
        "codec_enabled",
        "codec_deny_keys",
        "verify_sample_rate",
        "log_level",
    )
    assert merged.needs_restart == ("upstream", "tokenizer", "port", "max_streams")
    assert merge(running, running) == type(merged)(running, (), ())


def test_a_config_source_reads_the_file_under_its_env_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('upstream = "http://a"\ntokenizer = "t"\nport = 1\nmax_streams = 5\n')
    source = ConfigSource(config, {"CODEC_PROXY_PORT": "2"}, {"max_streams": 7})
    settings = source.load()
    assert (settings.port, settings.max_streams) == (2, 7)


def test_a_key_file_without_keys_is_reported_and_nothing_is_signalled(
    target: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# rotating\n")
    config = tmp_path / "codec-proxy.toml"
    config.write_text(f'upstream = "http://x"\ntokenizer = "t"\napi_key_file = "{keys}"\n')
    assert run_reload("--pid", str(target.pid), "--config", str(config)) == 2
    assert capsys.readouterr().err.startswith(
        "codec-proxy: 'api_key_file' holds no API key (only blank lines or # comments)"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        target.wait(0.3)  # still running: not signalled


def test_reload_never_prints_a_secret_of_the_file(
    target: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "codec-proxy.yaml"
    config.write_text("upstream: http://x\ntokenizer: t\napi_key: 12345678901234\n")
    assert run_reload("--pid", str(target.pid), "--config", str(config)) == 2
    assert capsys.readouterr().err == (
        f"codec-proxy: {config}: 'api_key' must be a list of a string, got an integer (secret: "
        "not shown) (nothing signalled)\n"
    )
    config.write_text('upstream: http://x\ntokenizer: t\napi_key: ["sk-live-4b9f8e21]\n')
    assert run_reload("--pid", str(target.pid), "--config", str(config)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"codec-proxy: {config}: not valid YAML: ")
    assert "sk-live-4b9f8e21" not in err
