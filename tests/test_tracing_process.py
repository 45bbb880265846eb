"""Traces from `codec-proxy serve --workers 2`: each worker exports its own spans, and what a
worker still holds is exported when SIGTERM drains it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.otlp_receiver import OtlpReceiver
from tests.process_support import ServeProcess
from tests.server.conftest import AiohttpServer


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on 127.0.0.1:`port`."""
    fds = Path(f"/proc/{pid}/fd")
    held = set()
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            held.add(os.readlink(fd))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.split(":")[1], 16) == port and f"socket:[{inode}]" in held:
            return True
    return False


def listeners(proxy: ServeProcess) -> int:
    """How many of the supervisor's children listen on its port (one is multiprocessing's
    resource tracker)."""
    pid = proxy.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sum(listening(int(child), proxy.port) for child in children)


def both_workers_listen(proxy: ServeProcess) -> None:
    """/readyz answers as soon as one worker serves: the kernel gives every connection to it
    until the other listens too."""
    deadline = time.monotonic() + 90
    while listeners(proxy) < 2:
        assert time.monotonic() < deadline, "the second worker never listened"
        time.sleep(0.1)


async def test_each_worker_exports_its_spans_and_a_drain_flushes_them(
    aiohttp_server: AiohttpServer, smollm2_gguf: Path
) -> None:
    upstream = await aiohttp_server(FakeUpstream().app())
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    # Batches every ten minutes: only the drain can have sent them.
    env = {"OTEL_BSP_SCHEDULE_DELAY": "600000"}
    proxy = ServeProcess(
        "--upstream", str(upstream.make_url("")).rstrip("/"),
        "--tokenizer", str(smollm2_gguf),
        "--drift-check", "off",
        "--workers", "2",
        "--otlp-traces-endpoint", str(collector.make_url("/v1/traces")),
        env=env,
    )  # fmt: skip
    try:
        await asyncio.to_thread(proxy.wait_ready)
        await asyncio.to_thread(both_workers_listen, proxy)
        requests = 20
        for _ in range(requests):
            # A new connection each time, so the kernel spreads them over both workers.
            async with aiohttp.ClientSession() as session:
                body = {"prompt": "x", "stream_format": "msgpack"}
                async with session.post(proxy.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert resp.headers["traceresponse"].startswith("00-")
                    await resp.read()
        await asyncio.sleep(0.2)
        assert receiver.spans == []  # held by each worker's batch processor
        proxy.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    finally:
        out = proxy.stop()
    servers = [s for s in receiver.spans if s.kind == "server"]
    assert len(servers) == requests, out[-3000:]
    assert len([s for s in receiver.spans if s.kind == "client"]) == requests
    # Two workers, two resources (the SDK gives each process its own instance id).
    assert len({s.resource["service.instance.id"] for s in servers}) == 2
