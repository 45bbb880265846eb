"""A client that leaves mid-stream: the proxy closes its upstream connection, and vLLM stops
generating at once, as vLLM's own metrics say.

`vllm:num_requests_running` is 1 while the client reads, and back to 0 within a second of the
client leaving; `vllm:generation_tokens_total` grew by a small part of the tokens the request
asked for (and vLLM would have generated without a stop: `ignore_eos`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from proxy import assets
from proxy.tokenizers.vocabulary import Vocabulary
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.vllm.conftest import Vllm
from tests.vllm.support import PINNED, metric, proxy_for

pytestmark = pytest.mark.vllm

MAX_TOKENS = 1500  # within --max-model-len 2048; a minute of generating at vLLM's CPU pace
LONG: dict[str, Any] = {
    **PINNED,
    "prompt": "Tell a story.",
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
}
WITHIN = 1.0  # seconds from the client leaving to vLLM running nothing


async def running(vllm: Vllm) -> float:
    return await metric(f"{vllm.url}/metrics", "vllm:num_requests_running")


async def generated(vllm: Vllm) -> float:
    return await metric(f"{vllm.url}/metrics", "vllm:generation_tokens_total")


async def wait_idle(vllm: Vllm, within: float) -> float:
    """Seconds until vLLM runs no request; fails after `within`."""
    started = time.monotonic()
    while await running(vllm):
        took = time.monotonic() - started
        assert took < within, f"vLLM still runs a request {took:.2f} s later"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.parametrize(
    "body",
    [{**LONG, "stream_format": "msgpack"}, {**LONG, "stream": True}],
    ids=["codec-mid-stream", "json-mid-stream"],
)
async def test_a_client_that_leaves_stops_vllm_within_a_second(
    vllm_server: Vllm,
    vllm_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
    body: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    proxy: ProxyClient = await proxy_for(vllm_server, vllm_vocabulary, aiohttp_client)
    await wait_idle(vllm_server, 60.0)  # nothing left over from earlier tests
    before = await generated(vllm_server)
    streaming = asyncio.Event()

    async def client() -> None:
        async with proxy.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readany()
            streaming.set()
            await asyncio.sleep(600)  # until it leaves

    task = asyncio.ensure_future(client())
    await asyncio.wait_for(streaming.wait(), 120)  # its first bytes are in: mid-stream
    assert await running(vllm_server) == 1
    task.cancel()  # the client leaves
    with pytest.raises(asyncio.CancelledError):
        await task
    took = await wait_idle(vllm_server, WITHIN)
    tokens = await generated(vllm_server) - before
    assert 0 < tokens < MAX_TOKENS / 4, tokens
    report = assets.cache_dir() / "reports" / "vllm-disconnect.json"
    report.parent.mkdir(exist_ok=True)
    figures = json.loads(report.read_text()) if report.exists() else {}
    figures[request.node.callspec.id] = {"idle_after_s": round(took, 3), "tokens": tokens}
    report.write_text(json.dumps(figures, indent=2) + "\n")
