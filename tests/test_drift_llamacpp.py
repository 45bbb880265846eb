"""The vocab handshake against the real llama.cpp server (SmolLM2-135M) and the real client.

* Drift: with the right tokenizer the check passes; with a deliberately wrong one (GPT-2's
  vocabulary from llama.cpp's test GGUFs) Codec requests get 503 while JSON passes through.
* Discovery: codecai's `discover_map`, `discover_index` and `load_map` fetch the map from the
  running proxy, and a `Detokenizer` built from the discovered map renders the proxy's
  streamed IDs to exactly the text llama.cpp generated.

Figures (drift check duration, map size) go to `.cache/reports/vocab-handshake.json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import codecai
import httpx
import pytest

from proxy import assets
from proxy.server import create_app
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.server.conftest import AiohttpClient, ProxyClient, default_model, drift_monitor
from tests.test_e2e_llamacpp import direct_stream, request_body
from tests.tokenizers.support import GOLDEN_PATH

pytestmark = pytest.mark.backend

MAP_ID = "huggingfacetb/smollm2-135m-instruct"
PROMPTS = [
    "The capital of France is",
    "Write a Python function that reverses a string:\n```python\n",
    "Emoji story: 🐱 + 🐶 =",
    "日本の首都は",
    "    indented code block with    multiple   spaces",
    "<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n",
]
REPORT = assets.cache_dir() / "reports" / "vocab-handshake.json"


def record(key: str, value: Any) -> None:
    REPORT.parent.mkdir(exist_ok=True)
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    report[key] = value
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


@pytest.fixture
async def right_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=smollm2_vocabulary.loaded.source, map_id=MAP_ID
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


@pytest.fixture
async def wrong_proxy(llama_server: str, aiohttp_client: AiohttpClient) -> ProxyClient:
    gpt2 = assets.llamacpp_vocab_dir() / "ggml-vocab-gpt-2.gguf"
    settings = pinned_draws.settings(upstream=(llama_server,), tokenizer=gpt2)
    return await aiohttp_client(create_app(settings, load_tokenizer(gpt2)))


def tokenizer_detail(proxy: ProxyClient) -> str:
    check = default_model(proxy).readiness.get("tokenizer")
    assert check is not None
    return check.detail


def origin(proxy: ProxyClient) -> str:
    return str(proxy.make_url("/")).rstrip("/")


async def test_the_right_tokenizer_passes_the_drift_check(right_proxy: ProxyClient) -> None:
    async with right_proxy.get("/readyz") as resp:
        assert resp.status == 200
        check = (await resp.json())["checks"]["tokenizer"]
    assert check["reason"] == "tokenizer_matches_backend"
    assert "on the llama.cpp backend, vocab_size 49152" in tokenizer_detail(right_proxy)
    monitor = drift_monitor(right_proxy)
    started = time.perf_counter()
    assert await monitor.check()
    record(
        "drift_check",
        {
            "backend": "llama.cpp (xllamacpp), SmolLM2-135M",
            "probes": len(monitor.probes),
            "seconds": round(time.perf_counter() - started, 3),
        },
    )


async def test_a_wrong_tokenizer_gets_503_for_codec_and_json_still_works(
    wrong_proxy: ProxyClient, llama_server: str
) -> None:
    async with wrong_proxy.get("/readyz") as resp:
        assert resp.status == 503
        reasons = (await resp.json())["reasons"]
    assert reasons[0]["reason"] == "tokenizer_mismatch"
    assert "vocab_size 50257 here, 49152 on the backend" in tokenizer_detail(wrong_proxy)
    for fmt in ("msgpack", "protobuf"):
        payload = request_body("The capital of France is", stream_format=fmt)
        async with wrong_proxy.post("/v1/completions", json=payload) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
        assert error["code"] == "tokenizer_mismatch"
        assert "tokenizer_mismatch" in error["message"]
    body = request_body("The capital of France is", stream=True)
    async with wrong_proxy.post("/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        raw = await resp.read()
    text = "".join(
        json.loads(event.removeprefix(b"data: "))["choices"][0]["text"]
        for event in raw.split(b"\n\n")
        if event.startswith(b"data: {")
    )
    assert text == await direct_stream(llama_server, "The capital of France is")


async def test_golden_smollm2_vectors_are_the_servers_ids(llama_server: str) -> None:
    golden = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
    async with aiohttp.ClientSession() as session:
        for text, expected in zip(
            golden["texts"], golden["families"]["smollm2"]["ids"], strict=True
        ):
            payload = {"content": text, "add_special": False, "parse_special": False}
            async with session.post(f"{llama_server}/tokenize", json=payload) as resp:
                assert (await resp.json())["tokens"] == expected, text


async def test_codecai_discovers_the_map_and_renders_the_stream(
    right_proxy: ProxyClient, llama_server: str, tmp_path: Path
) -> None:
    published = default_model(right_proxy).published
    async with httpx.AsyncClient() as client:
        discovered = await codecai.discover_map(
            origin=origin(right_proxy), id=MAP_ID, client=client
        )
        index = await codecai.discover_index(origin=origin(right_proxy), client=client)
        assert [(p.id, p.hash) for p in index.maps] == [(MAP_ID, published.hash)]
        loaded = await codecai.load_map(
            url=index.maps[0].url, hash=index.maps[0].hash, client=client,
            cache=codecai.MemoryMapCache(),
        )  # fmt: skip
    assert discovered == loaded
    assert (discovered.id, discovered.vocab_size, discovered.encoder) == (
        MAP_ID,
        49152,
        "byte_level",
    )
    record("smollm2_map", {"id": MAP_ID, "bytes": len(published.body), "hash": published.hash})
    for index_, prompt in enumerate(PROMPTS):
        fmt = "protobuf" if index_ % 2 else "msgpack"
        async with right_proxy.post(
            "/v1/completions", json=request_body(prompt, stream_format=fmt)
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Codec-Tokenizer-Map"] == f"{MAP_ID} {published.hash}"
            frames = await codecai_frames(await resp.read(), fmt)
        detokenizer = codecai.Detokenizer(discovered)
        text = "".join(detokenizer.render(f.ids, partial=not f.done) for f in frames)
        assert text == await direct_stream(llama_server, prompt), prompt


async def test_a_tampered_hash_is_caught_by_the_client(right_proxy: ProxyClient) -> None:
    published = default_model(right_proxy).published
    url = f"{origin(right_proxy)}/.well-known/codec/maps/sha256/{published.digest}.json"
    wrong = "sha256:" + ("0" if published.digest[0] != "0" else "1") + published.digest[1:]
    async with httpx.AsyncClient() as client:
        with pytest.raises(codecai.TokenizerMapHashMismatchError):
            await codecai.load_map(
                url=url, hash=wrong, client=client, cache=codecai.MemoryMapCache()
            )
