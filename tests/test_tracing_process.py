"""Traces from `codec-proxy serve --workers 2`: each worker exports its own spans, and what a
worker still holds is exported when SIGTERM drains it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.otlp_receiver import OtlpReceiver
from tests.process_support import ServeProcess, workers_listen
from tests.server.conftest import AiohttpServer


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
        await asyncio.to_thread(workers_listen, proxy, 2)
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
