"""End to end: compressed JSON (`json_compression = "on"`) from the real llama.cpp server.

For each coding, the stream is decompressed as it arrives with the standard libraries and
must carry exactly the text of a direct request (greedy, fixed seed), event after event, while
the model is still generating; a whole (non-streamed) completion comes compressed with its
length; and the OpenAI SDK reads the same text through the proxy over gzip.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.compression_support import WireCounter, decompress_whole, incremental_decompressor
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.test_e2e_llamacpp import MAX_TOKENS, direct_stream, request_body

pytestmark = pytest.mark.backend

PROMPT = "Once upon a time, in a land far away,"


@pytest.fixture
async def compressing_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,),
        tokenizer=smollm2_vocabulary.loaded.source,
        json_compression="on",
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


def stream_text(body: bytes) -> str:
    text = []
    for event in body.split(b"\n\n"):
        data = event.removeprefix(b"data: ").strip()
        if data and data != b"[DONE]":
            text.append(json.loads(data)["choices"][0]["text"])
    return "".join(text)


async def test_every_coding_streams_the_direct_text(
    compressing_proxy: ProxyClient, llama_server: str
) -> None:
    expected = await direct_stream(llama_server, PROMPT)
    for coding in ("gzip", "br", "zstd"):
        async with compressing_proxy.post(
            "/v1/completions",
            json=request_body(PROMPT, stream=True),
            headers={"Accept-Encoding": coding},
            auto_decompress=False,
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Encoding"] == coding
            assert "Accept-Encoding" in resp.headers["Vary"]
            decompress = incremental_decompressor(coding)
            loop = asyncio.get_running_loop()
            arrivals: list[float] = []
            wire = decoded = b""
            async for chunk in resp.content.iter_any():
                wire += chunk
                decoded += decompress(chunk)
                # Whole events only, every time something arrives.
                assert decoded.endswith(b"\n\n")
                arrivals.append(loop.time())
        assert decompress_whole(coding, wire) == decoded
        assert stream_text(decoded) == expected, coding
        assert len(wire) < len(decoded) / 3
        # Streamed, not buffered: decodable events arrived at several distinct moments.
        assert len(arrivals) >= 3
        assert arrivals[-1] - arrivals[0] > 0.01


async def test_a_whole_completion_is_compressed_with_its_length(
    compressing_proxy: ProxyClient, llama_server: str
) -> None:
    expected = await direct_stream(llama_server, PROMPT)
    async with compressing_proxy.post(
        "/v1/completions",
        json=request_body(PROMPT),
        headers={"Accept-Encoding": "gzip, br"},
        auto_decompress=False,
    ) as resp:
        assert resp.status == 200
        coding = resp.headers["Content-Encoding"]
        wire = await resp.read()
        assert resp.headers["Content-Length"] == str(len(wire))
    document = json.loads(decompress_whole(coding, wire))
    assert document["choices"][0]["text"] == expected
    assert document["usage"]["completion_tokens"] == MAX_TOKENS


async def test_the_openai_sdk_reads_the_direct_text_over_gzip(
    compressing_proxy: ProxyClient, llama_server: str
) -> None:
    expected = await direct_stream(llama_server, PROMPT)
    wire = WireCounter()
    async with openai.DefaultAsyncHttpxClient(transport=wire) as http:
        client = openai.AsyncOpenAI(
            base_url=str(compressing_proxy.make_url("/v1")), api_key="unused", http_client=http
        )
        stream = await client.completions.create(
            model="smollm2",
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=0,
            seed=7,
            stream=True,
            extra_body={"cache_prompt": False},
        )
        text = "".join([choice.text async for chunk in stream for choice in chunk.choices])
    assert text == expected
    assert wire.encodings == ["gzip"]
    assert wire.bytes > 0
