"""End to end: several models behind one proxy, with the real client.

Two real llama.cpp servers (SmolLM2-135M), configured as two models with their own maps, and a
replay backend standing for a Qwen3 model: it streams a fixed text and answers `/tokenize` with
Qwen3's real IDs, so its drift check passes. A fourth model's replay answers wrong IDs: it has
drifted. `codecai` discovers each model's map from the proxy (following the pointer form),
decodes each Codec body and renders it; the text must be what that model's backend generated.

Each llama.cpp server sits behind a counting relay, so "reached no backend" is counted, not
inferred.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import codecai
import httpx
import msgpack
import pytest
from aiohttp import web

from proxy import assets
from proxy.server import create_app
from proxy.server.data.upstreams import HEALTH_CHECK_HEADERS
from proxy.settings import ModelSettings
from proxy.tokenizers import LoadedTokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.server.conftest import AiohttpClient, AiohttpServer, ProxyClient
from tests.test_e2e_llamacpp import request_body

pytestmark = pytest.mark.backend

PROMPTS = [
    "The capital of France is",
    "Emoji story: 🐱 + 🐶 =",
    "<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n",
]
MAX_TOKENS = 32
# What the Qwen3 stand-in generates: scripts, digits and spacing Qwen3 and SmolLM2 split
# differently, streamed in pieces that cut through tokens.
QWEN_TEXT = (
    "Bonjour! 你好，世界。 The answer is 12345 (not 67890).\n\n"
    "  def f(x):\n      return x ** 2  # 🚀 done"
)
QWEN_PIECE = 3
HEALTH_AGENT = HEALTH_CHECK_HEADERS["User-Agent"]


@dataclass
class CountingRelay:
    """Forwards everything to a real backend and records what the proxy sent (its health
    checks apart): a request that reached no backend left no line here."""

    target: str
    requests: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.cleanup_ctx.append(self._session)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        # A fresh connection per request: llama.cpp closes kept-alive ones after a stream.
        connector = aiohttp.TCPConnector(force_close=True)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await self.session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("User-Agent") != HEALTH_AGENT:
            self.requests.append(f"{request.method} {request.path}")
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self.session.request(
            request.method, self.target + request.path_qs, data=body or None, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@dataclass
class QwenReplay:
    """A stand-in for a Qwen3 backend: streams `QWEN_TEXT` for any generation and tokenizes
    with Qwen3's tokenizer (each ID shifted by one when `drifted`)."""

    tokenizer: LoadedTokenizer
    drifted: bool = False
    requests: list[str] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("User-Agent") == HEALTH_AGENT:
            return web.json_response({"status": "ok"})
        self.requests.append(f"{request.method} {request.path}")
        if request.path == "/tokenize":
            text = (await request.json())["content"]
            ids = self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
            return web.json_response({"tokens": [i + 1 for i in ids] if self.drifted else ids})
        if request.path == "/v1/models":
            entry = {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "replay"}
            return web.json_response({"object": "list", "data": [entry]})
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = [QWEN_TEXT[i : i + QWEN_PIECE] for i in range(0, len(QWEN_TEXT), QWEN_PIECE)]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            choice = {"index": 0, "text": piece, "finish_reason": "length" if last else None}
            chunk = {"object": "text_completion", "model": "Qwen/Qwen3-8B", "choices": [choice]}
            event = b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
            self.sent.append(event)
            await response.write(event)
        await response.write(b"data: [DONE]\n\n")
        self.sent.append(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@dataclass
class Deployment:
    proxy: ProxyClient
    relays: dict[str, CountingRelay]
    replays: dict[str, QwenReplay]

    @property
    def origin(self) -> str:
        return str(self.proxy.make_url("/")).rstrip("/")

    def counts(self) -> dict[str, int]:
        relays = {name: len(relay.requests) for name, relay in self.relays.items()}
        return relays | {name: len(replay.requests) for name, replay in self.replays.items()}


Deploy = Callable[[], Awaitable[Deployment]]


@pytest.fixture
def deploy(
    llama_server: str,
    second_llama_server: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    qwen3_vocabulary: Vocabulary,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
) -> Deploy:
    async def make() -> Deployment:
        relays = {
            "smol-a": CountingRelay(llama_server),
            "smol-b": CountingRelay(second_llama_server),
        }
        replays = {
            "qwen": QwenReplay(qwen3_vocabulary.loaded),
            "qwen-drifted": QwenReplay(qwen3_vocabulary.loaded, drifted=True),
        }
        backends: dict[str, CountingRelay | QwenReplay] = {**relays, **replays}
        urls = {}
        for name, backend in backends.items():
            server = await aiohttp_server(backend.app())
            urls[name] = str(server.make_url("")).rstrip("/")
        qwen3 = assets.QWEN3_TOKENIZER.ensure()
        models = (
            ModelSettings(
                "smol-a", (urls["smol-a"],), smollm2_gguf, aliases=("smol",), map_id="smollm2/a"
            ),
            ModelSettings("smol-b", (urls["smol-b"],), smollm2_gguf, map_id="smollm2/b"),
            ModelSettings("qwen", (urls["qwen"],), qwen3, map_id="qwen3"),
            ModelSettings("qwen-drifted", (urls["qwen-drifted"],), qwen3, map_id="qwen3"),
        )
        vocabularies = {
            "smol-a": smollm2_vocabulary,
            "smol-b": smollm2_vocabulary,
            "qwen": qwen3_vocabulary,
            "qwen-drifted": qwen3_vocabulary,
        }
        app = create_app(pinned_draws.settings(models=models), vocabularies)
        return Deployment(await aiohttp_client(app), relays, replays)

    return make


async def discovered_maps(origin: str) -> dict[str, tuple[str, codecai.TokenizerMap]]:
    """Each model's map as codecai finds it: the index, then each map by its id (a pointer,
    followed to the content-addressed copy and checked against its hash)."""
    async with httpx.AsyncClient() as client:
        index = await codecai.discover_index(origin=origin, client=client)
        raw_index = (await client.get(f"{origin}/.well-known/codec/index.json")).json()
        maps: dict[str, tuple[str, codecai.TokenizerMap]] = {}
        for pointer, entry in zip(index.maps, raw_index["maps"], strict=True):
            assert entry["id"] == pointer.id
            tokenizer_map = await codecai.discover_map(origin=origin, id=pointer.id, client=client)
            for name in entry["models"]:
                maps[name] = (f"{pointer.id} {pointer.hash}", tokenizer_map)
    return maps


def rendered(tokenizer_map: codecai.TokenizerMap, frames: list[codecai.CodecFrame]) -> str:
    detokenizer = codecai.Detokenizer(tokenizer_map)
    return "".join(detokenizer.render(f.ids, partial=not f.done) for f in frames)


def sse_text(raw: bytes) -> str:
    text: list[str] = []
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ").strip()
        if data and data != b"[DONE]":
            text.extend(choice.get("text", "") for choice in json.loads(data)["choices"])
    return "".join(text)


async def json_text(proxy: ProxyClient, body: dict[str, object]) -> str:
    async with proxy.post("/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200
        return sse_text(await resp.read())


async def codec(
    proxy: ProxyClient, path: str = "/v1/completions", **kwargs: Any
) -> tuple[int, dict[str, str], bytes]:
    async with proxy.post(path, **kwargs) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_each_models_stream_decodes_with_its_own_discovered_map(
    deploy: Deploy, smollm2_vocabulary: Vocabulary, qwen3_vocabulary: Vocabulary
) -> None:
    deployment = await deploy()
    proxy = deployment.proxy
    maps = await discovered_maps(deployment.origin)
    assert set(maps) == {"smol-a", "smol", "smol-b", "qwen", "qwen-drifted"}
    # Three maps (two ids for one tokenizer, and Qwen3's), each model on its own.
    assert len({maps[name][0] for name in ("smol-a", "smol-b", "qwen")}) == 3
    assert maps["qwen"][0] == maps["qwen-drifted"][0]
    assert maps["qwen"][1].vocab_size == qwen3_vocabulary.loaded.vocab_size
    assert maps["smol-b"][1].vocab_size == smollm2_vocabulary.loaded.vocab_size
    for model, other in (("smol", "smol-b"), ("smol-b", "smol-a")):
        for index, prompt in enumerate(PROMPTS):
            fmt = "protobuf" if index % 2 else "msgpack"
            before = deployment.counts()
            expected = await json_text(proxy, request_body(prompt, model=model))
            body = request_body(prompt, model=model, stream_format=fmt)
            status, headers, raw = await codec(proxy, json=body)
            assert status == 200
            header, tokenizer_map = maps[model]
            assert headers["Codec-Tokenizer-Map"] == header
            assert rendered(tokenizer_map, await codecai_frames(raw, fmt)) == expected, prompt
            after = deployment.counts()
            # Both requests went to this model's server, none to the other's.
            routed = "smol-a" if model == "smol" else model
            assert after[routed] - before[routed] == 2
            assert after[other] == before[other]
    # Path B, named by Codec-Model: the same text as the same token-ID prompt as JSON.
    prompt_ids = smollm2_vocabulary.loaded.tokenizer.encode(PROMPTS[0]).ids
    expected = await json_text(
        proxy, {"model": "smol-b", "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0}
    )
    request = msgpack.packb({"prompt_ids": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0})
    status, headers, raw = await codec(
        proxy,
        "/v1/completions/codec",
        data=request,
        headers={"Content-Type": "application/x-msgpack", "Codec-Model": "smol-b"},
    )
    assert status == 200
    assert headers["Codec-Tokenizer-Map"] == maps["smol-b"][0]
    assert rendered(maps["smol-b"][1], await codecai_frames(raw, "msgpack")) == expected
    # The Qwen3 model: its own map renders its backend's text; SmolLM2's does not.
    for fmt in ("msgpack", "protobuf"):
        status, headers, raw = await codec(
            proxy, json={"model": "qwen", "prompt": "Hi", "stream_format": fmt}
        )
        assert status == 200
        assert headers["Codec-Tokenizer-Map"] == maps["qwen"][0]
        frames = await codecai_frames(raw, fmt)
        assert rendered(maps["qwen"][1], frames) == QWEN_TEXT
        assert rendered(maps["smol-a"][1], frames) != QWEN_TEXT


async def test_an_unknown_model_reaches_no_backend(deploy: Deploy) -> None:
    deployment = await deploy()
    proxy = deployment.proxy
    before = deployment.counts()
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"json": request_body("Hi", model="nope", stream_format="msgpack")}),
        ("/v1/completions", {"json": request_body("Hi", model="nope", stream=True)}),
        (
            "/v1/chat/completions",
            {
                "json": {
                    "model": "nope",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stream_format": "protobuf",
                }
            },
        ),
        (
            "/v1/completions/codec",
            {
                "data": msgpack.packb({"prompt_ids": [504, 3575]}),
                "headers": {"Content-Type": "application/x-msgpack", "Codec-Model": "nope"},
            },
        ),
        ("/v1/embeddings", {"json": {"model": "nope", "input": "Hi"}}),
    ]
    for path, kwargs in requests:
        status, _, raw = await codec(proxy, path, **kwargs)
        assert status == 404, (path, raw)
        assert json.loads(raw)["error"]["code"] == "model_not_found"
    async with proxy.get("/v1/models") as resp:
        names = [entry["id"] for entry in (await resp.json())["data"]]
    assert names == ["smol-a", "smol", "smol-b", "qwen", "qwen-drifted"]
    assert deployment.counts() == before


async def test_drift_on_one_model_refuses_codec_for_that_model_only(deploy: Deploy) -> None:
    deployment = await deploy()
    proxy = deployment.proxy
    # The drift check at start asked each model's own backend.
    assert "POST /tokenize" in deployment.replays["qwen-drifted"].requests
    assert "POST /tokenize" in deployment.relays["smol-b"].requests
    for fmt in ("msgpack", "protobuf"):
        before = deployment.counts()
        status, _, raw = await codec(
            proxy, json={"model": "qwen-drifted", "prompt": "Hi", "stream_format": fmt}
        )
        assert status == 503, raw
        assert json.loads(raw)["error"]["code"] == "tokenizer_mismatch"
        assert deployment.counts() == before  # refused before the backend is asked
    maps = await discovered_maps(deployment.origin)
    for model in ("smol-a", "smol-b"):
        body = request_body(PROMPTS[0], model=model, stream_format="msgpack")
        status, _, raw = await codec(proxy, json=body)
        assert status == 200
        text = rendered(maps[model][1], await codecai_frames(raw, "msgpack"))
        assert text == await json_text(proxy, request_body(PROMPTS[0], model=model))
    status, _, raw = await codec(
        proxy, json={"model": "qwen", "prompt": "Hi", "stream_format": "msgpack"}
    )
    assert status == 200
    assert rendered(maps["qwen"][1], await codecai_frames(raw, "msgpack")) == QWEN_TEXT
    # JSON to the drifted model still passes, byte for byte.
    replay = deployment.replays["qwen-drifted"]
    replay.sent.clear()
    async with proxy.post(
        "/v1/completions", json={"model": "qwen-drifted", "prompt": "Hi", "stream": True}
    ) as resp:
        assert resp.status == 200
        assert await resp.read() == b"".join(replay.sent)
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200  # only the default model is required
        report = await resp.json()
    assert report["models"]["qwen-drifted"]["codec"] is False
    assert report["models"]["qwen-drifted"]["checks"]["tokenizer"]["reason"] == (
        "tokenizer_mismatch"
    )
    for model in ("smol-a", "smol-b", "qwen"):
        assert report["models"][model]["codec"] is True, model
        assert report["models"][model]["checks"]["tokenizer"]["reason"] == (
            "tokenizer_matches_backend"
        )
