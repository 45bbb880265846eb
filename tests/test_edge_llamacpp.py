"""Slow clients in front of the real llama.cpp server: a request whose body stalls is dropped
with a 408 and never reaches the backend, while a normal request beside it is served."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.server.raw_http import connections, parse

pytestmark = pytest.mark.backend

TIMEOUT = 1.0


@pytest.fixture
async def proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,),
        tokenizer=smollm2_vocabulary.loaded.source,
        request_timeout=TIMEOUT,
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


async def test_a_stalled_body_is_dropped_while_a_normal_request_is_served(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    async with connections() as connect:
        stalled = await connect(proxy)
        await stalled.send(
            b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000000\r\n\r\n{"prompt": "The capital of France is", "max'
        )
        dropped = asyncio.ensure_future(stalled.until_closed())
        body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        async with proxy.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["choices"][0]["text"]
        assert await dropped < TIMEOUT + 1.0
        response, rest = parse(stalled.received)
    assert response.status == 408
    assert json.loads(response.body)["error"]["code"] == "request_timeout"
    assert response.headers["connection"] == "close"
    assert rest == b""
    lines = {line["status"]: line for r in caplog.records if (line := getattr(r, "fields", None))}
    assert lines[408]["outcome"] == "request_timeout"
    assert lines[408]["upstream"] is None  # never sent to the backend
    assert lines[200]["upstream"] is not None
