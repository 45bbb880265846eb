"""The vocab handshake against a real vLLM: its `/tokenize`, its `/v1/models`, the reference
client's discovery.

* Drift: with the tokenizer.json vLLM serves the check matches; with the one transformers
  writes for the same GGUF (SmolLM2's digit splitting lost, the same 49152 IDs) vLLM's own
  `/tokenize` shows the difference: drift is reported, Codec refused with 503, JSON relayed.
* vLLM tokenizes every probe string as llama.cpp does, reading the GGUF itself: the converted
  directory tokenizes as the model llama.cpp serves, not just as the proxy's reading of it.
* Discovery: the proxy learns from vLLM's `/v1/models` that it is vLLM and its context length;
  codecai discovers the proxy's map and renders vLLM's text from the frames.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import codecai
import httpx
import pytest

from proxy.core.backend.drift import drift_probes
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.probes import PROBE_STRINGS
from proxy.tokenizers.vocabulary import Vocabulary
from tests.codec_client import codecai_frames
from tests.server.conftest import AiohttpClient, ProxyClient, default_model, drift_monitor
from tests.vllm.conftest import Vllm
from tests.vllm.support import PINNED, proxy_for, vllm_answer

pytestmark = pytest.mark.vllm

MAP_ID = "huggingfacetb/smollm2-135m-instruct"
MAX_MODEL_LEN = 2048  # the README's --max-model-len


async def vllm_tokenize(vllm: Vllm, text: str) -> list[int]:
    body = {"model": "smollm2", "prompt": text, "add_special_tokens": False}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{vllm.url}/tokenize", json=body) as resp:
            assert resp.status == 200, await resp.text()
            tokens: list[int] = (await resp.json())["tokens"]
    return tokens


@pytest.fixture
async def right_proxy(
    vllm_server: Vllm, vllm_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    return await proxy_for(vllm_server, vllm_vocabulary, aiohttp_client, map_id=MAP_ID)


@pytest.fixture
async def near_miss_proxy(vllm_server: Vllm, aiohttp_client: AiohttpClient) -> ProxyClient:
    # Built by transformers from the same GGUF (tests/vllm/convert_gguf.py keeps it).
    near_miss = vllm_server.model_dir / "tokenizer.transformers.json"
    vocabulary = Vocabulary.build(load_tokenizer(near_miss))
    return await proxy_for(vllm_server, vocabulary, aiohttp_client)


async def test_the_served_tokenizer_matches_vllm(right_proxy: ProxyClient) -> None:
    async with right_proxy.get("/readyz") as resp:
        assert resp.status == 200
        check = (await resp.json())["checks"]["tokenizer"]
    assert check["reason"] == "tokenizer_matches_backend"
    monitor = drift_monitor(right_proxy)
    assert monitor.verdict.detail == (
        f"{len(monitor.probes)} probe strings tokenize identically on the vLLM backend"
    )
    assert len(monitor.probes) > 100


async def test_a_near_miss_tokenizer_is_drift_and_codec_is_refused(
    near_miss_proxy: ProxyClient, vllm_server: Vllm
) -> None:
    async with near_miss_proxy.get("/readyz") as resp:
        assert resp.status == 503
        reasons = (await resp.json())["reasons"]
    assert reasons[0]["reason"] == "tokenizer_mismatch"
    verdict = drift_monitor(near_miss_proxy).verdict
    assert "does not match the vLLM backend's" in verdict.detail
    # What differs is digits: vLLM splits every one (its own answer is the right side).
    for difference in verdict.differences:
        assert any(c.isnumeric() for c in difference.text), difference
        assert list(difference.backend_ids) == await vllm_tokenize(vllm_server, difference.text)
    assert verdict.differing >= 1
    body: dict[str, Any] = {**PINNED, "prompt": "The year 1969 was", "max_tokens": 16}
    for fmt in ("msgpack", "protobuf"):
        async with near_miss_proxy.post(
            "/v1/completions", json={**body, "stream_format": fmt}
        ) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["code"] == "tokenizer_mismatch"
    async with near_miss_proxy.post("/v1/completions", json=body) as resp:
        assert resp.status == 200
        relayed = (await resp.json())["choices"][0]["text"]
    assert relayed == (await vllm_answer(vllm_server, "/v1/completions", body)).text


async def test_vllm_tokenizes_as_llama_cpp_reading_the_gguf(
    vllm_server: Vllm, vllm_vocabulary: Vocabulary, llama_server: str
) -> None:
    # The drift check's probe strings, but those holding a control token's text, which vLLM's
    # /tokenize parses as the token and llama.cpp's (asked not to) as text.
    texts = drift_probes(PROBE_STRINGS, vllm_vocabulary.loaded.special_tokens)
    async with aiohttp.ClientSession() as session:
        for text in texts:
            payload = {"content": text, "add_special": False, "parse_special": False}
            async with session.post(f"{llama_server}/tokenize", json=payload) as resp:
                expected = (await resp.json())["tokens"]
            assert await vllm_tokenize(vllm_server, text) == expected, text


async def test_discovery_from_vllm_and_by_codecai(
    right_proxy: ProxyClient, vllm_server: Vllm
) -> None:
    model = default_model(right_proxy)
    # From vLLM's /v1/models (`owned_by: vllm`, `max_model_len`), read by the drift check.
    assert model.listing.backend_kind() == "vllm"
    assert model.listing.context_length() == MAX_MODEL_LEN
    origin = str(right_proxy.make_url("/")).rstrip("/")
    published = model.published
    async with httpx.AsyncClient() as client:
        index = await codecai.discover_index(origin=origin, client=client)
        assert [(p.id, p.hash) for p in index.maps] == [(MAP_ID, published.hash)]
        discovered = await codecai.load_map(
            url=index.maps[0].url, hash=index.maps[0].hash, client=client,
            cache=codecai.MemoryMapCache(),
        )  # fmt: skip
    assert (discovered.id, discovered.vocab_size) == (MAP_ID, 49152)
    for index_, prompt in enumerate(["The capital of France is", "def fibonacci(n):"]):
        fmt = "protobuf" if index_ else "msgpack"
        body = {**PINNED, "prompt": prompt, "max_tokens": 24}
        async with right_proxy.post("/v1/completions", json={**body, "stream_format": fmt}) as resp:
            assert resp.status == 200
            assert resp.headers["Codec-Tokenizer-Map"] == f"{MAP_ID} {published.hash}"
            frames = await codecai_frames(await resp.read(), fmt)
        detokenizer = codecai.Detokenizer(discovered)
        text = "".join(detokenizer.render(f.ids, partial=not f.done) for f in frames)
        assert text == (await vllm_answer(vllm_server, "/v1/completions", body)).text, prompt
