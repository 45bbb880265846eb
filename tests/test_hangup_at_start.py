"""A SIGHUP while the proxy starts (a config watcher, `codec-proxy reload`, `kill -HUP`) neither
ends it nor is lost: held from the first line of `python -m proxy`, applied once it serves, with
one process and with `--workers 2` (proxy/hangups.py)."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream
from tests.process_support import ServeProcess
from tests.server.conftest import AiohttpServer

# Loaded by every Python process started with this directory on PYTHONPATH: the proxy sends
# itself a SIGHUP as `proxy.cli` starts to import (its imports and parser take some 0.3 s) and
# as it opens its config file, the moments a signal from outside lands in most often. The
# supervisor's workers are left alone (their own start is covered by the signal mask).
SITECUSTOMIZE = """\
import os, signal, sys

_config = os.environ["CODEC_TEST_HANGUP_CONFIG"]
_pending = {"import", "open"}

def _hangup_at_start(event, args):
    if event == "import" and args[0] == "proxy.cli":
        point = "import"
    elif event == "open" and str(args[0]) == _config:
        point = "open"
    else:
        return
    # `orig_argv`: a spawned worker's `sys.argv` is its parent's.
    if point in _pending and "--multiprocessing-fork" not in sys.orig_argv:
        _pending.discard(point)
        sys.stderr.write(f"test: SIGHUP at {point}\\n")
        os.kill(os.getpid(), signal.SIGHUP)

sys.addaudithook(_hangup_at_start)
"""


@pytest.fixture
async def upstream_url(aiohttp_server: AiohttpServer) -> str:
    server = await aiohttp_server(FakeUpstream().app())
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
def started() -> Iterator[list[ServeProcess]]:
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        process.stop()


def reloads_ok(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    prefix = 'codec_proxy_config_reloads_total{result="ok"} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_sighup_while_starting_is_held_and_applied_once_serving(
    tmp_path: Path,
    upstream_url: str,
    smollm2_gguf: Path,
    started: list[ServeProcess],
    workers: int,
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    config = tmp_path / "codec-proxy.toml"
    config.write_text(f'upstream = "{upstream_url}"\ntokenizer = "{smollm2_gguf}"\n')
    env = {"PYTHONPATH": str(hook), "CODEC_TEST_HANGUP_CONFIG": str(config)}
    proxy = ServeProcess(
        "--config", str(config), "--drift-check", "off", "--workers", str(workers), env=env
    )
    started.append(proxy)
    await asyncio.to_thread(proxy.wait_ready)  # without the fix: ended by the first signal
    deadline = asyncio.get_running_loop().time() + 30
    # Each worker reloads once as it starts serving: the signals were owed, not lost.
    while await asyncio.to_thread(reloads_ok, proxy.url) < workers:
        assert asyncio.get_running_loop().time() < deadline, "the held SIGHUP was not applied"
        await asyncio.sleep(0.1)
    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    out = proxy.stop()
    assert "test: SIGHUP at import\ntest: SIGHUP at open\n" in out
    assert out.count("test: SIGHUP") == 2  # the workers signalled nothing themselves
    applied = [line for line in out.splitlines() if "config reloaded" in line]
    assert len(applied) == workers, out[-3000:]
    assert "restarting it" not in out
