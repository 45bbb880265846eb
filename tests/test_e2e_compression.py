"""End to end: compressed Codec streams from the real llama.cpp server running SmolLM2-135M.

For every coding and both formats, the stream is decompressed as it arrives with the standard
libraries (the zstd dictionary fetched from the proxy and picked by codecai), decoded by
codecai, and must render exactly the text of a direct JSON-SSE request. Frames must arrive
while the model is still generating, not all at the end.
"""

from __future__ import annotations

import asyncio

import codecai
import pytest

from proxy.core.wire.decoder import FrameDecoder
from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames, codecai_map, render
from tests.compression_support import CODINGS, decompress_whole, incremental_decompressor
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.test_e2e_llamacpp import direct_stream, request_body

pytestmark = pytest.mark.backend

PROMPT = "Once upon a time, in a land far away,"


@pytest.fixture
async def real_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=smollm2_vocabulary.loaded.source
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
async def test_every_coding_renders_the_direct_text(
    real_proxy: ProxyClient, llama_server: str, smollm2_vocabulary: Vocabulary, fmt: str
) -> None:
    expected = await direct_stream(llama_server, PROMPT)
    tokenizer_map = codecai_map(smollm2_vocabulary.loaded)
    for coding in CODINGS:
        async with real_proxy.post(
            "/v1/completions",
            json=request_body(PROMPT, stream_format=fmt),
            # A Codec client insisting on the coding under test (zstd is for Codec clients).
            headers=codecai.with_codec_client_version(
                {"Accept-Encoding": coding if coding == "identity" else f"{coding}, identity;q=0"}
            ),
            auto_decompress=False,
        ) as resp:
            assert resp.status == 200
            headers = dict(resp.headers)
            assert headers.get("Content-Encoding", "identity") == coding
            dictionary = None
            if coding == "zstd":
                async with real_proxy.get(
                    "/.well-known/codec/dicts/" + headers["Codec-Zstd-Dict"][7:] + ".zstd"
                ) as dict_resp:
                    fetched = await dict_resp.read()
                dictionary = codecai.select_zstd_dict_for_response(
                    headers, loaded_dicts={codecai.hash_zstd_dict(fetched): fetched}
                )
            decompress = incremental_decompressor(coding, dictionary)
            decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
            loop = asyncio.get_running_loop()
            arrivals: list[float] = []
            wire = b""
            async for chunk in resp.content.iter_any():
                wire += chunk
                arrivals += [loop.time() for _ in decoder.feed(decompress(chunk))]
        frames = await codecai_frames(decompress_whole(coding, wire, dictionary), fmt)
        assert render(tokenizer_map, frames) == expected, coding
        # Streamed, not buffered: decodable frames arrived at several distinct moments.
        assert len(arrivals) >= 3
        assert arrivals[-1] - arrivals[0] > 0.01
