"""`codec-proxy reload` against real processes in front of the real llama.cpp backend: the edited
file applied by the one process, and by every worker of `--workers 2`."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy import pidfile
from tests.process_support import ROOT, ServeProcess

CODEC = {"prompt": "Hi", "max_tokens": 4, "stream_format": "msgpack"}
JSON = {"prompt": "Hi", "max_tokens": 4}

pytestmark = pytest.mark.backend


class Served(ServeProcess):
    """`codec-proxy serve --config FILE --pid-file PATH`, run from this checkout."""

    def __init__(self, config: Path, pid_file: Path, *extra: str) -> None:
        super().__init__("--config", str(config), "--pid-file", str(pid_file), *extra)


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(config: Path, pid_file: Path, *extra: str) -> Served:
        started.append(Served(config, pid_file, *extra))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def codec_proxy(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


async def status(url: str, body: dict[str, object]) -> int:
    """One request on a new connection (the kernel spreads those over the workers)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status


async def reloads(url: str, result: str) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    prefix = f'codec_proxy_config_reloads_total{{result="{result}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 60
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def write_config(path: Path, upstream: str, tokenizer: Path, extra: str = "") -> None:
    # `port` here is beaten by the --port flag, at start and at every reload: no restart asked.
    path.write_text(f'upstream = "{upstream}"\ntokenizer = "{tokenizer}"\nport = 1\n{extra}')


async def test_reload_applies_the_edited_file_to_the_running_proxy(
    llama_server: str, smollm2_gguf: Path, tmp_path: Path, serve: Callable[..., Served]
) -> None:
    config, pid_file = tmp_path / "codec-proxy.toml", tmp_path / "run" / "codec-proxy.pid"
    pid_file.parent.mkdir()
    write_config(config, llama_server, smollm2_gguf)
    proxy = serve(config, pid_file)
    await asyncio.to_thread(proxy.wait_ready)
    assert pidfile.read(pid_file) == proxy.proc.pid
    assert await status(proxy.url, CODEC) == 200

    write_config(config, llama_server, smollm2_gguf, "codec_enabled = false\n")
    done = codec_proxy("reload", "--pid-file", str(pid_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"codec-proxy: sent SIGHUP to {proxy.proc.pid}")

    async def refused() -> bool:
        return await status(proxy.url, CODEC) == 403

    await until(refused, "Codec was still served after the reload")
    assert await status(proxy.url, JSON) == 200

    # A broken file: refused, counted, and the settings stay those of the last good one.
    write_config(config, llama_server, smollm2_gguf, "codec_enabled = true\nflush_frames = -1\n")
    assert codec_proxy("reload", "--pid-file", str(pid_file)).returncode == 0

    async def counted() -> bool:
        return await reloads(proxy.url, "error") == 1

    await until(counted, "the refused reload was not counted")
    assert await status(proxy.url, CODEC) == 403
    assert await reloads(proxy.url, "ok") == 1

    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    assert not pid_file.exists()
    lines = [line for line in proxy.stop().splitlines() if "config reload" in line]
    assert len(lines) == 2
    assert lines[0].endswith("config reloaded (generation 1): changed codec_enabled")
    assert lines[1].endswith(
        f"config reload refused, nothing changed: {config}: 'flush_frames' must be >= 0, got -1"
    )


async def test_every_worker_applies_the_reload(
    llama_server: str, smollm2_gguf: Path, tmp_path: Path, serve: Callable[..., Served]
) -> None:
    config, pid_file = tmp_path / "codec-proxy.toml", tmp_path / "codec-proxy.pid"
    write_config(config, llama_server, smollm2_gguf)
    proxy = serve(config, pid_file, "--workers", "2")
    await asyncio.to_thread(proxy.wait_ready)
    # The supervisor's: it forwards the signal to every worker.
    assert pidfile.read(pid_file) == proxy.proc.pid

    write_config(config, llama_server, smollm2_gguf, "codec_enabled = false\n")
    assert codec_proxy("reload", "--pid-file", str(pid_file)).returncode == 0

    async def both() -> bool:
        return await reloads(proxy.url, "ok") == 2  # /metrics sums the workers' samples

    await until(both, "not every worker reloaded")
    # New connections land on both workers: none serves Codec any more.
    statuses = [await status(proxy.url, CODEC) for _ in range(20)]
    assert statuses == [403] * 20
    assert await status(proxy.url, JSON) == 200

    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    assert not pid_file.exists()
    out = proxy.stop()
    applied = [line for line in out.splitlines() if "config reloaded" in line]
    assert len(applied) == 2, out[-3000:]
    assert all(line.endswith("(generation 1): changed codec_enabled") for line in applied)


async def test_a_reload_signalled_while_the_workers_start_is_applied_once_they_serve(
    llama_server: str, smollm2_gguf: Path, tmp_path: Path, serve: Callable[..., Served]
) -> None:
    config, pid_file = tmp_path / "codec-proxy.toml", tmp_path / "codec-proxy.pid"
    write_config(config, llama_server, smollm2_gguf)
    proxy = serve(config, pid_file, "--workers", "2")
    deadline = time.monotonic() + 30
    while not pid_file.exists():  # written before the workers are even spawned
        assert time.monotonic() < deadline, "no pid file"
        await asyncio.sleep(0.01)
    # Still loading tokenizers, or not yet spawned: SIGHUP must neither end them nor be lost.
    write_config(config, llama_server, smollm2_gguf, "codec_enabled = false\n")
    assert codec_proxy("reload", "--pid-file", str(pid_file)).returncode == 0
    await asyncio.to_thread(proxy.wait_ready)

    async def both() -> bool:
        return await reloads(proxy.url, "ok") >= 2

    await until(both, "not every worker reloaded")
    assert [await status(proxy.url, CODEC) for _ in range(20)] == [403] * 20
    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    out = proxy.stop()
    assert "restarting it" not in out  # no worker was ended by the signal
