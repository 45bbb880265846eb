"""What vLLM itself answers, for the tests to compare the proxy with; a proxy in front of it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.server.test_verification import decoders_built
from tests.vllm.conftest import SERVED_NAME, Vllm

# Greedy, and a seed besides: the same request gives the same tokens, direct or through a proxy.
PINNED: dict[str, Any] = {"model": SERVED_NAME, "temperature": 0, "seed": 7}


@dataclass(frozen=True)
class Answer:
    """vLLM's own JSON answer to a request (not streamed), with the IDs it sampled."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: str | int | None


async def vllm_answer(vllm: Vllm, path: str, body: dict[str, Any]) -> Answer:
    """`body` sent to vLLM directly, whole (`stream: false`), asking for its `token_ids`."""
    request = {**body, "stream": False, "return_token_ids": True}
    request.pop("stream_format", None)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{vllm.url}{path}", json=request) as resp:
            assert resp.status == 200, await resp.text()
            [choice] = (await resp.json())["choices"]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return Answer(text, choice["token_ids"], choice["finish_reason"], choice["stop_reason"])


async def proxy_for(
    vllm: Vllm, vocabulary: Vocabulary, client: AiohttpClient, **changes: Any
) -> ProxyClient:
    """The proxy in process in front of vLLM with `vocabulary`'s tokenizer. The drift check at
    start (on unless `changes` say otherwise) tells it from `/v1/models` that vLLM is behind it."""
    settings = pinned_draws.settings(
        upstream=(vllm.url,), tokenizer=vocabulary.loaded.source, **changes
    )
    proxy = await client(create_app(settings, vocabulary))
    if settings.verify_sample_rate > 0:
        await decoders_built(proxy)
    return proxy


async def metric(url: str, name: str, labels: str = "") -> float:
    """One sample of a Prometheus text page, by name and (a part of) its labels."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            assert resp.status == 200
            page = await resp.text()
    pattern = rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$"
    found = re.findall(pattern, page, re.MULTILINE)
    assert len(found) == 1, f"{name}{{{labels}}}: {found} in\n{page[:3000]}"
    return float(found[0])
