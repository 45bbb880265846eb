"""The OpenAI Python SDK streaming through the proxy with `json_compression` on.

The SDK's HTTP client (httpx2 in the SDK installed here, httpx in older ones) offers gzip on
every request and decodes it on its own; the SDK must read exactly what it reads with
compression off, while the wire carried gzip. The wire is watched below the client's
decoding: its own transport, counting the bytes as they came and recording the response's
`Content-Encoding`.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.compression_support import WireCounter
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient


async def sdk_stream(proxy: ProxyClient, chat: bool) -> tuple[list[dict[str, Any]], WireCounter]:
    """Every chunk the SDK parsed, as plain data, and what the wire carried."""
    wire = WireCounter()
    async with openai.DefaultAsyncHttpxClient(transport=wire) as http:
        client = openai.AsyncOpenAI(
            base_url=str(proxy.make_url("/v1")), api_key="unused", http_client=http
        )
        if chat:
            stream: Any = await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
        else:
            stream = await client.completions.create(
                model="smollm2", prompt="The capital of France is", max_tokens=32, stream=True
            )
        chunks = [chunk.model_dump() async for chunk in stream]
    return chunks, wire


def text_of(chunks: list[dict[str, Any]], chat: bool) -> str:
    parts = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            parts.append((choice["delta"]["content"] or "") if chat else choice["text"])
    return "".join(parts)


@pytest.mark.parametrize(
    ("capture_name", "chat"),
    [
        ("vllm-completions-sample.txt", False),
        ("llamacpp-completions-sample.txt", False),
        ("vllm-chat.txt", True),
    ],
)
async def test_the_sdk_reads_the_same_stream_over_gzip(
    make_proxy: MakeProxy, upstream: FakeUpstream, capture_name: str, chat: bool
) -> None:
    capture = load_capture(capture_name)
    upstream.script = Script(capture, chunk_size=97)
    plain, plain_wire = await sdk_stream(await make_proxy(), chat)
    upstream.script = Script(capture, chunk_size=97)
    compressed, wire = await sdk_stream(await make_proxy(json_compression="on"), chat)
    assert compressed == plain
    text = text_of(compressed, chat)
    assert text == capture.stream_text(chat=chat) != ""
    # The SDK offers gzip (with deflate and br); the proxy sent gzip, the smallest at its
    # flush schedule, and the bytes on the wire are the compressed ones.
    assert "gzip" in wire.offered[0]
    assert (plain_wire.encodings, wire.encodings) == (["identity"], ["gzip"])
    assert plain_wire.bytes == len(capture.body)
    assert wire.bytes < len(capture.body) / 2
