"""The README's vLLM recipe as written: vLLM (the session's, started from it) and `codec-proxy
serve` with an admin port and a traces endpoint, as an endpoint picker and a collector see them.

* The serving port's `/metrics` is vLLM's, its own metric names, with the request the proxy sent
  counted; the proxy's is on the admin port.
* One trace from the caller to vLLM: the proxy's server span under the caller's `traceparent`,
  its client span under that, and vLLM's own `llm_request` span under the client span, with
  vLLM's count of the tokens it generated. Run with `-s` to see the trace printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.embedded import free_port
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, render_trace
from tests.server.conftest import AiohttpServer
from tests.server.support import frames_of, ids_of
from tests.vllm.conftest import Vllm
from tests.vllm.recipe import (
    ADMIN_PORT,
    COLLECTOR,
    MODEL,
    PROXY_PORT,
    VLLM_PORT,
    Process,
    codec_proxy,
    readme_commands,
    substituted,
)
from tests.vllm.support import PINNED, metric

pytestmark = pytest.mark.vllm

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
BODY: dict[str, Any] = {
    **PINNED,
    "prompt": "The capital of France is",
    "max_tokens": 16,
    "stream_format": "msgpack",
}


@dataclass(frozen=True)
class RecipeProxy:
    url: str  # the serving port
    admin: str  # the admin port


@pytest.fixture
def proxy(
    vllm_server: Vllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RecipeProxy]:
    """The README's proxy command in front of the session's vLLM, sending its spans where
    vLLM sends its own."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    _, command = readme_commands()
    port, admin_port = free_port(), free_port()
    values = {
        "http://127.0.0.1:" + VLLM_PORT: vllm_server.url,
        MODEL: str(vllm_server.model_dir),
        PROXY_PORT: str(port),
        ADMIN_PORT: str(admin_port),
        COLLECTOR: f"http://127.0.0.1:{vllm_server.otlp_port}",
        ".venv/bin/codec-proxy": codec_proxy(),
    }
    # Spans sent every 20 ms instead of every 5 s.
    env = {**command.env, "OTEL_BSP_SCHEDULE_DELAY": "20", "PYTHONUNBUFFERED": "1"}
    process = Process(substituted(command.argv, values), env, tmp_path / "proxy.log", "codec-proxy")
    proxy = RecipeProxy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")
    try:
        process.wait_until(proxy.admin + "/readyz", 120)
        yield proxy
    finally:
        process.stop()


async def get(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            assert resp.status == 200
            return await resp.text()


def metric_names(page: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", page, re.MULTILINE))


async def codec_request(url: str, headers: dict[str, str] | None = None) -> bytes:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=BODY, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.read()


async def spans_of(
    receiver: OtlpReceiver, trace_id: str, count: int, seconds: float = 30.0
) -> list[ReceivedSpan]:
    """The spans of one trace, once there are `count` (vLLM also sends those of earlier
    requests, which had no receiver to go to)."""
    deadline = time.monotonic() + seconds
    while len(spans := [s for s in receiver.spans if s.trace_id == trace_id]) < count:
        assert time.monotonic() < deadline, render_trace(spans)
        await asyncio.sleep(0.05)
    return spans


async def test_the_serving_port_scrapes_as_vllm_the_admin_port_as_the_proxy(
    proxy: RecipeProxy, vllm_server: Vllm
) -> None:
    success = 'finished_reason="length"'
    before = await metric(f"{vllm_server.url}/metrics", "vllm:request_success_total", success)
    frames = frames_of(await codec_request(proxy.url), "msgpack")
    assert len(ids_of(frames)) == 16
    serving, direct = await get(proxy.url + "/metrics"), await get(vllm_server.url + "/metrics")
    # vLLM's own page, relayed: its metric names, none of the proxy's, the request counted.
    assert metric_names(serving) == metric_names(direct)
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= metric_names(serving)
    assert "codec_proxy_" not in serving
    after = await metric(proxy.url + "/metrics", "vllm:request_success_total", success)
    assert after == before + 1
    own = await get(proxy.admin + "/metrics")
    assert not any(name.startswith("vllm:") for name in metric_names(own))
    codec = await metric(
        proxy.admin + "/metrics", "codec_proxy_requests_total", 'route="/v1/completions"'
    )
    assert codec == 1


async def test_one_trace_from_the_caller_to_vllm(
    proxy: RecipeProxy, vllm_server: Vllm, aiohttp_server: AiohttpServer
) -> None:
    receiver = OtlpReceiver()
    # Where the recipe sends the spans of both: vLLM's to /v1/traces, the proxy's to the base.
    await aiohttp_server(receiver.app(), port=vllm_server.otlp_port)
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    frames = frames_of(await codec_request(proxy.url, {"traceparent": traceparent}), "msgpack")
    spans = await spans_of(receiver, CALLER_TRACE, 3)
    print("\n" + render_trace(spans))
    [server] = [s for s in spans if s.kind == "server" and s.name != "llm_request"]
    [client] = [s for s in spans if s.kind == "client"]
    [llm] = [s for s in spans if s.name == "llm_request"]
    assert server.parent_id == CALLER_SPAN
    assert client.parent_id == server.span_id
    # vLLM's own span, from its own process, under the proxy's client span.
    assert llm.parent_id == client.span_id
    assert llm.kind == "server"
    assert "vllm.process_id" in llm.resource
    assert llm.attributes["gen_ai.usage.completion_tokens"] == len(ids_of(frames)) == 16
    # vLLM names the request after the X-Request-Id the proxy sent it.
    assert server.attributes["codec.request_id"] in llm.attributes["gen_ai.request.id"]
    assert server.start <= client.start <= llm.start <= llm.end <= client.end <= server.end
