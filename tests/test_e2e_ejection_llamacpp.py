"""End to end on the real llama.cpp server: requests it refuses never take it out of rotation.

llama.cpp answers a chat request whose `tools` is not an array with 500, `/v1/embeddings` on a
server started without `--embeddings` with 501, a bad prompt with 400 and an unknown route with
404. Each is about that one request, so repeating it many times over `eject_after` must leave
the backend serving and `/readyz` at 200 (proxy/core/backend/balancer.py).
"""

from __future__ import annotations

import pytest

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.server.conftest import AiohttpClient

pytestmark = pytest.mark.backend

EJECT_AFTER = 2
# (path, body, what llama.cpp answers): each caused by the request, none by the server's health.
REFUSED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tools": 5}, 500),
    ("/v1/embeddings", {"input": "Hi"}, 501),
    ("/v1/completions", {"prompt": 5, "max_tokens": 4}, 400),
    ("/v1/no-such-route", {}, 404),
]


async def test_refused_requests_leave_the_backend_in_rotation(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> None:
    # The one server listed twice (the trailing slash makes a second entry): with two upstreams
    # the last-one-stays rule cannot hide a request error that was counted.
    settings = pinned_draws.settings(
        upstream=(llama_server, llama_server + "/"),
        tokenizer=smollm2_vocabulary.loaded.source,
        eject_after=EJECT_AFTER,
        health_interval=60,
    )
    proxy = await aiohttp_client(create_app(settings, smollm2_vocabulary))
    for path, body, status in REFUSED:
        for _ in range(4 * EJECT_AFTER):  # in a row: any other answer would clear a count
            async with proxy.post(path, json=body) as resp:
                assert resp.status == status, path  # llama.cpp's own answer, never our 503
                assert (await resp.json())["error"]["code"] == status
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    async with proxy.post("/v1/completions", json=body | {"stream_format": "msgpack"}) as resp:
        assert resp.status == 200
        frames = await codecai_frames(await resp.read(), "msgpack")
    assert frames[-1].done
    assert frames[-1].finish_reason in ("length", "eos_token")
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200, await resp.text()
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert "codec_proxy_upstream_ejections_total 0.0" in text
    assert 'codec_proxy_upstream_errors_total{kind="status_5xx",model="default"} 16.0' in text
