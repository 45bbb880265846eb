"""The real `openai` SDK in front of a real vLLM, two ways that give it Codec on the wire:

    SDK ─(AsyncCodecTransport / CodecTransport)─Codec─► proxy ─JSON─► vLLM
    SDK ─JSON─► edge (upstream_protocol = "codec") ═Codec═► inner proxy ─JSON─► vLLM

Either way the text, finish reasons and completion-token counts the SDK reads equal what it reads
from vLLM answered directly (greedy, a fixed seed, no prefix cache): completions and chat,
streamed and whole, with stop strings.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from proxy.sdk import AsyncCodecTransport, CodecTransport
from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.vllm.conftest import Vllm
from tests.vllm.support import PINNED, proxy_for

pytestmark = pytest.mark.vllm

MAX_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Write a Python function that reverses a string:\n```python\n",
    "List three primary colors:\n1.",
    "<|im_start|>user\nWhat is the tallest mountain?<|im_end|>\n<|im_start|>assistant\n",
]
QUESTIONS = ["What is the capital of France?", "What is 2+2?", "Write a haiku about the sea."]
# (kind, prompt or question, extra arguments): what each way is asked.
ASKED: list[tuple[str, str, dict[str, Any]]] = [
    *[("completions", prompt, {}) for prompt in PROMPTS],
    *[("chat", question, {}) for question in QUESTIONS],
    ("completions", "The capital of France is", {"stop": [" answer"]}),
    ("chat", "What is 2+2?", {"stop": ["classic"]}),
]


def arguments(kind: str, text: str, extra: dict[str, Any]) -> dict[str, Any]:
    if kind == "completions":
        asked: dict[str, Any] = {"prompt": text}
    else:
        asked = {"messages": [{"role": "user", "content": text}]}
    return {**PINNED, **asked, "max_tokens": MAX_TOKENS, **extra}


def summary(kind: str, chunks: list[Any]) -> dict[str, Any]:
    text, finish, tokens = [], None, None
    for chunk in chunks:
        for choice in chunk.choices:
            text.append(choice.text if kind == "completions" else choice.delta.content or "")
            finish = choice.finish_reason or finish
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return {"text": "".join(text), "finish": finish, "completion_tokens": tokens}


async def streamed(sdk: AsyncOpenAI, kind: str, text: str, extra: dict[str, Any]) -> dict[str, Any]:
    usage = {"stream_options": {"include_usage": True}}
    endpoint: Any = sdk.completions if kind == "completions" else sdk.chat.completions
    stream = await endpoint.create(stream=True, **usage, **arguments(kind, text, extra))
    return summary(kind, [chunk async for chunk in stream])


async def whole(sdk: AsyncOpenAI, kind: str, text: str, extra: dict[str, Any]) -> dict[str, Any]:
    endpoint: Any = sdk.completions if kind == "completions" else sdk.chat.completions
    answer = await endpoint.create(**arguments(kind, text, extra))
    [choice] = answer.choices
    return {
        "text": choice.text if kind == "completions" else choice.message.content,
        "finish": choice.finish_reason,
        "completion_tokens": answer.usage.completion_tokens,
    }


def assert_same(
    through: dict[str, Any], direct: dict[str, Any], asked: tuple[str, str, dict[str, Any]]
) -> None:
    """Read through Codec as read from vLLM. Usage counts the IDs a Codec client got
    (docs/CLIENTS.md), which leave a matched stop string out; vLLM counts its tokens in."""
    if "stop" in asked[2]:
        assert direct["finish"] == "stop", (direct, asked)  # the string was met
        assert through["completion_tokens"] <= direct["completion_tokens"]
        through, direct = {**through, "completion_tokens": 0}, {**direct, "completion_tokens": 0}
    assert through == direct, asked


def sdk_of(base_url: str, transport: httpx.AsyncBaseTransport | None = None) -> AsyncOpenAI:
    http = httpx.AsyncClient(transport=transport)
    return AsyncOpenAI(base_url=base_url, api_key="none", http_client=http, max_retries=0)  # type: ignore[arg-type]


@pytest.fixture
async def proxy(
    vllm_server: Vllm, vllm_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    return await proxy_for(vllm_server, vllm_vocabulary, aiohttp_client)


async def test_the_codec_transport_reads_as_vllm_answers(
    proxy: ProxyClient, vllm_server: Vllm
) -> None:
    transport = AsyncCodecTransport()
    direct = sdk_of(f"{vllm_server.url}/v1")
    codec = sdk_of(str(proxy.make_url("/v1")), transport)
    async with direct, codec:
        for kind, text, extra in ASKED:
            through = await streamed(codec, kind, text, extra)
            assert_same(through, await streamed(direct, kind, text, extra), (kind, text, extra))
            assert through["finish"] in ("length", "stop")
    assert transport.stats.codec_responses == len(ASKED)
    assert transport.stats.fallbacks == {}
    # The sync client over the sync transport, one of each kind.
    sync_transport = CodecTransport()

    def sync_stream(kind: str, text: str) -> dict[str, Any]:
        with httpx.Client(transport=sync_transport) as http:
            sdk = OpenAI(base_url=str(proxy.make_url("/v1")), api_key="none", http_client=http)  # type: ignore[arg-type]
            endpoint: Any = sdk.completions if kind == "completions" else sdk.chat.completions
            return summary(kind, list(endpoint.create(stream=True, **arguments(kind, text, {}))))

    async with sdk_of(f"{vllm_server.url}/v1") as direct:
        for kind, text in [("completions", PROMPTS[0]), ("chat", QUESTIONS[0])]:
            through = await asyncio.to_thread(sync_stream, kind, text)
            expected = await streamed(direct, kind, text, {})
            assert through == {**expected, "completion_tokens": None}, (kind, text)
    assert sync_transport.stats.codec_responses == 2


@pytest.fixture
async def edge(
    vllm_server: Vllm, vllm_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    """The client side of the long hop: no tokenizer, the inner proxy's map pinned from its
    index; the inner proxy as deployed in front of vLLM."""
    inner = await proxy_for(vllm_server, vllm_vocabulary, aiohttp_client)
    upstream = str(inner.make_url("")).rstrip("/")
    settings = pinned_draws.settings(upstream=(upstream,), upstream_protocol="codec")
    return await aiohttp_client(create_app(settings))


async def test_two_proxies_answer_as_vllm_does(edge: ProxyClient, vllm_server: Vllm) -> None:
    direct = sdk_of(f"{vllm_server.url}/v1")
    chain = sdk_of(str(edge.make_url("/v1")))
    async with direct, chain:
        for kind, text, extra in ASKED:
            through = await streamed(chain, kind, text, extra)
            assert_same(through, await streamed(direct, kind, text, extra), (kind, text, extra))
        for kind, text, extra in [ASKED[0], ASKED[len(PROMPTS)], ASKED[-2]]:
            through = await whole(chain, kind, text, extra)
            assert_same(through, await whole(direct, kind, text, extra), (kind, text, extra))
    async with edge.get("/metrics") as resp:
        page = await resp.text()
    # The middle hop carried Codec: the edge rendered IDs into the JSON its clients read.
    assert "codec_proxy_rendered_tokens_total{" in page
