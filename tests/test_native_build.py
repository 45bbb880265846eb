"""proxy/native.py: a native steady path that is wanted must be built, and built from the
source beside it; the switch turns it off, at build and at run time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import native
from proxy.core import steady


def test_the_switch_serves_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(steady.ENV_SWITCH, "1")
    assert native.checked() == native.PYTHON_PATH
    monkeypatch.setenv(steady.ENV_SWITCH, "0")  # `0` is not the switch
    assert not steady.disabled()


def test_the_switch_is_not_taken_for_an_unknown_setting(tmp_path: Path) -> None:
    # Every other CODEC_PROXY_* variable names a setting, and a typo stops the proxy; the switch
    # is read at import, and a proxy started with it must start (on the Python path).
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    config = tmp_path / "c.toml"
    config.write_text(f'upstream = "http://127.0.0.1:1"\ntokenizer = "{tokenizer}"\n')
    env = {**os.environ, steady.ENV_SWITCH: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(steady.disabled(), reason="this run is the Python path's")
def test_a_missing_build_stops_the_proxy_with_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "NATIVE", None)
    with pytest.raises(
        native.NativeBuildError, match=r"pip install -e .*CODEC_PROXY_NO_EXTENSIONS"
    ):
        native.checked()


@pytest.mark.skipif(steady.NATIVE is None, reason="built without the native steady path")
def test_a_build_older_than_its_source_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert native.checked() == native.NATIVE_PATH  # this build is this source's
    edited = tmp_path / "_steady.c"
    edited.write_bytes(native.SOURCE.read_bytes() + b"\n/* edited since the build */\n")
    monkeypatch.setattr(native, "SOURCE", edited)
    with pytest.raises(native.NativeBuildError, match=r"built from another _steady\.c"):
        native.checked()
