"""End to end: the real `openai` SDK over `proxy.sdk`'s transports, the proxy in process, the
real llama.cpp server (SmolLM2-135M) behind it.

For the same requests at temperature 0 (fixed seed, no prompt cache), the text and finish
reasons the SDK yields from Codec equal what it yields from JSON, for completions and chat,
sync and async clients, every content coding; the bytes each took on the wire are written to
`.cache/reports/e2e-openai-sdk.json`. Tool calls: the bundled model has no tool template
(tests/fixtures/upstream/README.md), so a chat with `tools` answers in text here; the calls
themselves are checked on the replayed vLLM stream in tests/server/test_openai_sdk.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from proxy import assets
from proxy.sdk import AsyncCodecTransport, CodecTransport
from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.test_e2e_llamacpp import MAX_TOKENS, PROMPTS

pytestmark = pytest.mark.backend

Mode = Literal["sync", "async"]
# Deterministic llama.cpp (tests/test_e2e_llamacpp.py): the same logits from scratch each time.
DETERMINISTIC: dict[str, Any] = {"seed": 7, "cache_prompt": False}
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Tell me a joke about computers.",
    "Translate 'good morning' into Japanese.",
    "What is 12 times 12?",
]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
async def proxy(
    llama_server: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
) -> ProxyClient:
    # The defaults a deployment gets: backend IDs where llama.cpp reports them, the shipped
    # dictionaries, the flush schedule.
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=smollm2_gguf, drift_check=False
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


class Downloads:
    """httpx's count of the body bytes each response took (`num_bytes_downloaded`)."""

    def __init__(self) -> None:
        self.responses: list[httpx.Response] = []

    def hook(self, response: httpx.Response) -> None:
        self.responses.append(response)

    async def ahook(self, response: httpx.Response) -> None:
        self.responses.append(response)

    @property
    def total(self) -> int:
        return sum(response.num_bytes_downloaded for response in self.responses)


async def through_sdk(
    proxy: ProxyClient,
    mode: Mode,
    transport: CodecTransport | AsyncCodecTransport | None,
    downloads: Downloads,
    call: Callable[[Any], Any],
) -> Any:
    """`call(client)`, the client of `mode` over `transport` (None: plain JSON)."""
    base_url = str(proxy.make_url("/v1"))
    if mode == "sync":
        assert transport is None or isinstance(transport, CodecTransport)

        def run() -> Any:
            hooks = {"response": [downloads.hook]}
            with httpx.Client(transport=transport, event_hooks=hooks) as http:
                # openai 3.x types `http_client` as httpx2's client and takes httpx's too.
                client = OpenAI(base_url=base_url, api_key="none", http_client=http)  # type: ignore[arg-type]
                return call(client)

        return await asyncio.to_thread(run)
    assert transport is None or isinstance(transport, AsyncCodecTransport)
    async with httpx.AsyncClient(
        transport=transport, event_hooks={"response": [downloads.ahook]}
    ) as http:
        client = AsyncOpenAI(base_url=base_url, api_key="none", http_client=http)  # type: ignore[arg-type]
        return await call(client)


def completion(prompt: str, mode: Mode, **extra: Any) -> Callable[[Any], Any]:
    def request(client: Any) -> Any:
        return client.completions.create(
            model="smollm2",
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body=DETERMINISTIC,
            **extra,
        )

    return _summarised(request, mode, lambda choice: choice.text)


def chat(question: str, mode: Mode, **extra: Any) -> Callable[[Any], Any]:
    def request(client: Any) -> Any:
        return client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body=DETERMINISTIC,
            **extra,
        )

    return _summarised(request, mode, lambda choice: choice.delta.content or "")


def _summarised(
    request: Callable[[Any], Any], mode: Mode, text_of: Callable[[Any], str]
) -> Callable[[Any], Any]:
    def summary(chunks: list[Any]) -> dict[str, Any]:
        text, finish, calls = [], None, 0
        for chunk in chunks:
            for choice in chunk.choices:
                text.append(text_of(choice))
                finish = choice.finish_reason or finish
                calls += len(getattr(getattr(choice, "delta", None), "tool_calls", None) or [])
        return {"text": "".join(text), "finish": finish, "tool_calls": calls}

    if mode == "sync":
        return lambda client: summary(list(request(client)))

    async def call(client: Any) -> dict[str, Any]:
        return summary([chunk async for chunk in await request(client)])

    return call


def transport_for(mode: Mode, **options: Any) -> CodecTransport | AsyncCodecTransport:
    return CodecTransport(**options) if mode == "sync" else AsyncCodecTransport(**options)


def figures(transport: CodecTransport | AsyncCodecTransport, json_bytes: int) -> dict[str, Any]:
    stats = transport.stats
    tokens = max(stats.codec_tokens, 1)
    return {
        "streams": stats.codec_responses,
        "tokens": stats.codec_tokens,
        "codec_wire_bytes": stats.codec_wire_bytes,
        "rendered_json_sse_bytes": stats.rendered_bytes,
        "json_wire_bytes": json_bytes,
        "codec_bytes_per_token": round(stats.codec_wire_bytes / tokens, 2),
        "json_bytes_per_token": round(json_bytes / tokens, 1),
        "json_over_codec": round(json_bytes / max(stats.codec_wire_bytes, 1), 1),
    }


REPORT: dict[str, Any] = {}


def write_report() -> None:
    out = assets.cache_dir() / "reports" / "e2e-openai-sdk.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(REPORT, indent=2, ensure_ascii=False) + "\n")


# Prompts per client mode: the first eight of tests/test_e2e_llamacpp.py's list (prose, code,
# a list, a translation, arithmetic, history, a chat template, a story).
SAMPLE = 8


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_completions_as_from_json(proxy: ProxyClient, mode: Mode) -> None:
    transport = transport_for(mode)
    codec_downloads, json_downloads = Downloads(), Downloads()
    for prompt in PROMPTS[:SAMPLE]:
        codec = await through_sdk(proxy, mode, transport, codec_downloads, completion(prompt, mode))
        plain = await through_sdk(proxy, mode, None, json_downloads, completion(prompt, mode))
        assert codec == plain, prompt
        assert codec["finish"] in ("length", "stop")
    assert transport.stats.codec_responses == SAMPLE
    assert transport.stats.fallbacks == {}
    # What the SDK read is what the transport rendered.
    assert codec_downloads.total == transport.stats.rendered_bytes
    REPORT[f"completions_{mode}"] = figures(transport, json_downloads.total)
    write_report()
    assert transport.stats.codec_wire_bytes * 5 < json_downloads.total


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_chat_as_from_json(proxy: ProxyClient, mode: Mode) -> None:
    transport = transport_for(mode)
    codec_downloads, json_downloads = Downloads(), Downloads()
    for question in QUESTIONS:
        codec = await through_sdk(proxy, mode, transport, codec_downloads, chat(question, mode))
        plain = await through_sdk(proxy, mode, None, json_downloads, chat(question, mode))
        assert codec == plain, question
    # Offered a tool, the bundled model answers in text: the same text either way.
    tools = {"tools": [WEATHER_TOOL]}
    question = "What is the weather in Paris? Use the tool."
    codec = await through_sdk(
        proxy, mode, transport, codec_downloads, chat(question, mode, **tools)
    )
    plain = await through_sdk(proxy, mode, None, json_downloads, chat(question, mode, **tools))
    assert codec == plain
    assert transport.stats.codec_responses == len(QUESTIONS) + 1
    REPORT[f"chat_{mode}"] = figures(transport, json_downloads.total)
    write_report()
    assert transport.stats.codec_wire_bytes * 5 < json_downloads.total


@pytest.mark.parametrize("coding", ["identity", "gzip", "br", "zstd"])
async def test_each_coding_on_the_wire(proxy: ProxyClient, coding: str) -> None:
    transport = AsyncCodecTransport(accept_encoding=coding)
    json_downloads = Downloads()
    for prompt in PROMPTS[:3]:
        codec = await through_sdk(
            proxy, "async", transport, Downloads(), completion(prompt, "async")
        )
        plain = await through_sdk(proxy, "async", None, json_downloads, completion(prompt, "async"))
        assert codec == plain, prompt
    REPORT[f"coding_{coding}"] = figures(transport, json_downloads.total)
    write_report()
    assert bool(transport.assets._dictionaries) == (coding == "zstd")


async def test_stop_strings_and_usage(proxy: ProxyClient) -> None:
    transport = AsyncCodecTransport()
    prompt = "The capital of France is"
    for stop in ([" Paris"], ["."], ["\n\n", "United"]):
        codec = await through_sdk(
            proxy, "async", transport, Downloads(), completion(prompt, "async", stop=stop)
        )
        plain = await through_sdk(
            proxy, "async", None, Downloads(), completion(prompt, "async", stop=stop)
        )
        assert codec == plain, stop
        assert codec["finish"] == "stop"

    async def usage(client: Any) -> Any:
        stream = await client.completions.create(
            model="smollm2",
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=DETERMINISTIC,
        )
        return [chunk.usage async for chunk in stream if chunk.usage][-1]

    codec_usage = await through_sdk(proxy, "async", transport, Downloads(), usage)
    json_usage = await through_sdk(proxy, "async", None, Downloads(), usage)
    # The completion's tokens are counted from the IDs; the prompt's are not on the wire.
    assert codec_usage.completion_tokens == json_usage.completion_tokens == 16
    assert codec_usage.prompt_tokens == 0 < json_usage.prompt_tokens
