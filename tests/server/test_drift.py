"""The drift check in the running app, against fake backends that tokenize with real tokenizers
in llama.cpp's and vLLM's `/tokenize` shapes (tests/fixtures/upstream/README.md).

The real llama.cpp server is in tests/test_drift_llamacpp.py; these fakes add what it cannot
show: vLLM's shape, a backend without `/tokenize`, failures, and a backend changing over time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web

from proxy import assets
from proxy.server import create_app
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    ProxyClient,
    default_model,
    drift_monitor,
)

Dialect = Literal["llama.cpp", "vLLM", "none"]
CODEC_BODY = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}


@dataclass
class TokenizingBackend:
    """A backend whose /tokenize answers with `tokenizer`, in one dialect; it replays a real
    llama.cpp completion stream on /v1/completions."""

    tokenizer: LoadedTokenizer
    dialect: Dialect = "llama.cpp"
    n_vocab: int | None = None  # what /v1/models reports (llama.cpp only)
    failing: bool = False
    fail_after: int | None = None  # answer 500 once this many probes were answered
    tokenize_bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        if request.path == "/tokenize":
            return await self._tokenize(request)
        if request.path == "/v1/models":
            meta = {"meta": {"n_vocab": self.n_vocab}} if self.n_vocab is not None else {}
            return web.json_response({"object": "list", "data": [{"id": "m", **meta}]})
        capture = load_capture("llamacpp-completions-sample.txt")
        return web.Response(body=capture.body, content_type="text/event-stream")

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.dialect == "none":
            return web.json_response({"error": "not found"}, status=404)
        if self.failing or (
            self.fail_after is not None and len(self.tokenize_bodies) >= self.fail_after
        ):
            return web.json_response({"error": "overloaded"}, status=500)
        body = await request.json()
        self.tokenize_bodies.append(body)
        field_name = "content" if self.dialect == "llama.cpp" else "prompt"
        if field_name not in body:
            if self.dialect == "llama.cpp":
                return web.json_response({"tokens": []})
            return web.json_response(
                {"object": "error", "message": "prompt: Field required"}, status=400
            )
        ids = self.tokenizer.tokenizer.encode(body[field_name], add_special_tokens=False).ids
        if self.dialect == "vLLM":
            return web.json_response(
                {"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None}
            )
        return web.json_response({"tokens": ids})


@pytest.fixture(scope="session")
def gpt2_tokenizer() -> LoadedTokenizer:
    """A deliberately wrong tokenizer for a SmolLM2 backend."""
    return load_tokenizer(assets.llamacpp_vocab_dir() / "ggml-vocab-gpt-2.gguf")


async def start_proxy(
    backend: TokenizingBackend,
    vocabulary: Vocabulary,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    smollm2_gguf: Path,
    **changes: Any,
) -> ProxyClient:
    server = await aiohttp_server(backend.app())
    url = str(server.make_url("")).rstrip("/")
    settings = pinned_draws.settings(upstream=(url,), tokenizer=smollm2_gguf)
    return await aiohttp_client(create_app(replace(settings, **changes), vocabulary))


@pytest.fixture
def proxy_for(
    smollm2_vocabulary: Vocabulary,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    smollm2_gguf: Path,
) -> Any:
    async def make(backend: TokenizingBackend, **changes: Any) -> ProxyClient:
        return await start_proxy(
            backend, smollm2_vocabulary, aiohttp_server, aiohttp_client, smollm2_gguf, **changes
        )

    return make


async def readyz(proxy: ProxyClient) -> tuple[int, dict[str, Any]]:
    async with proxy.get("/readyz") as resp:
        assert resp.headers["Cache-Control"] == "no-store"
        return resp.status, await resp.json()


def tokenizer_detail(proxy: ProxyClient) -> str:
    check = default_model(proxy).readiness.get("tokenizer")
    assert check is not None
    return check.detail


async def codec_status(proxy: ProxyClient) -> tuple[int, bytes]:
    async with proxy.post("/v1/completions", json=CODEC_BODY) as resp:
        return resp.status, await resp.read()


@pytest.mark.parametrize("dialect", ["llama.cpp", "vLLM"])
async def test_the_right_tokenizer_passes(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer, dialect: Dialect
) -> None:
    backend = TokenizingBackend(smollm2_tokenizer, dialect, n_vocab=49152)
    proxy = await proxy_for(backend)
    status, report = await readyz(proxy)
    assert status == 200
    check = report["checks"]["tokenizer"]
    assert check["reason"] == "tokenizer_matches_backend"
    assert "detail" not in check  # /readyz is open: codes only, the detail is for the log
    detail = tokenizer_detail(proxy)
    assert f"on the {dialect} backend" in detail
    assert (await codec_status(proxy))[0] == 200
    probes = len(drift_monitor(proxy).probes)
    assert probes >= 250
    field_name = "content" if dialect == "llama.cpp" else "prompt"
    # Every probe once, and the first once more to find the dialect.
    assert len([b for b in backend.tokenize_bodies if field_name in b]) == probes + 1
    if dialect == "llama.cpp":
        assert "vocab_size 49152" in detail
        assert all(
            b["add_special"] is False and b["parse_special"] is False
            for b in backend.tokenize_bodies
        )
    else:
        bodies = [b for b in backend.tokenize_bodies if "prompt" in b]
        assert all(b["add_special_tokens"] is False for b in bodies)


async def test_vllm_requests_name_the_configured_model(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer
) -> None:
    backend = TokenizingBackend(smollm2_tokenizer, "vLLM")
    await proxy_for(backend, model="HuggingFaceTB/SmolLM2-135M-Instruct")
    bodies = [b for b in backend.tokenize_bodies if "prompt" in b]
    assert bodies
    assert {b["model"] for b in bodies} == {"HuggingFaceTB/SmolLM2-135M-Instruct"}


async def test_a_wrong_tokenizer_refuses_codec_and_keeps_json(
    proxy_for: Any, gpt2_tokenizer: LoadedTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "codec_proxy")
    proxy = await proxy_for(TokenizingBackend(gpt2_tokenizer))
    status, report = await readyz(proxy)
    assert status == 503
    assert report["status"] == "not_ready"
    assert report["reasons"][0]["reason"] == "tokenizer_mismatch"
    status, body = await codec_status(proxy)
    assert status == 503
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "tokenizer_mismatch")
    assert "tokenizer_mismatch" in error["message"]
    assert "does not match" not in error["message"]  # details stay in the log
    async with proxy.post("/v1/completions", json={"prompt": "Hi", "stream": True}) as resp:
        assert resp.status == 200
        assert await resp.read() == load_capture("llamacpp-completions-sample.txt").body
    async with proxy.get("/v1/models") as resp:
        assert resp.status == 200
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[0].startswith("tokenizer drift: the proxy's tokenizer does not match")
    assert any(line.startswith("  probe 'Hello world': proxy [") for line in errors)
    assert errors[-1].startswith("  ... and ")


async def test_a_vocab_size_difference_alone_refuses_codec(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer
) -> None:
    proxy = await proxy_for(TokenizingBackend(smollm2_tokenizer, n_vocab=49153))
    status, report = await readyz(proxy)
    assert status == 503
    assert report["reasons"] == [
        {"check": "tokenizer", "reason": "tokenizer_mismatch", "model": "default"}
    ]
    assert "vocab_size 49152 here, 49153 on the backend" in tokenizer_detail(proxy)
    assert (await codec_status(proxy))[0] == 503


async def test_no_tokenize_endpoint_warns_once_and_serves(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "codec_proxy")
    proxy = await proxy_for(TokenizingBackend(smollm2_tokenizer, "none"))
    monitor = drift_monitor(proxy)
    assert await monitor.check()
    status, report = await readyz(proxy)
    assert status == 200
    assert report["checks"]["tokenizer"]["reason"] == "backend_has_no_tokenize"
    assert (await codec_status(proxy))[0] == 200
    warnings = [r for r in caplog.records if "no usable /tokenize" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING


async def test_a_failing_backend_leaves_the_check_pending_then_recovers(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    backend = TokenizingBackend(smollm2_tokenizer, failing=True)
    proxy = await proxy_for(backend)
    status, report = await readyz(proxy)
    assert status == 503
    assert report["reasons"][0]["reason"] == "drift_check_pending"
    # Not a mismatch: nothing says the IDs are wrong, so Codec is not refused.
    assert (await codec_status(proxy))[0] == 200
    assert any("could not conclude" in r.getMessage() for r in caplog.records)
    backend.failing = False
    assert await drift_monitor(proxy).check()
    assert (await readyz(proxy))[0] == 200


async def test_a_backend_that_changes_tokenizer_is_caught_and_released(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer, gpt2_tokenizer: LoadedTokenizer
) -> None:
    backend = TokenizingBackend(smollm2_tokenizer)
    proxy = await proxy_for(backend)
    monitor = drift_monitor(proxy)
    assert (await codec_status(proxy))[0] == 200
    backend.tokenizer = gpt2_tokenizer
    assert await monitor.check()
    assert (await codec_status(proxy))[0] == 503
    backend.tokenizer = smollm2_tokenizer
    assert await monitor.check()
    assert (await codec_status(proxy))[0] == 200
    assert (await readyz(proxy))[0] == 200


async def test_the_check_repeats_on_its_interval(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer
) -> None:
    backend = TokenizingBackend(smollm2_tokenizer)
    proxy = await proxy_for(backend, drift_check_interval=0.2)
    probes = len(drift_monitor(proxy).probes)
    for _ in range(100):
        if len(backend.tokenize_bodies) >= 2 * probes:
            break
        await asyncio.sleep(0.1)
    assert len(backend.tokenize_bodies) >= 2 * probes


async def test_turned_off_it_asks_nothing(proxy_for: Any, gpt2_tokenizer: LoadedTokenizer) -> None:
    backend = TokenizingBackend(gpt2_tokenizer)
    proxy = await proxy_for(backend, drift_check=False)
    status, report = await readyz(proxy)
    assert status == 200
    assert report["checks"]["tokenizer"]["reason"] == "drift_check_disabled"
    assert (await codec_status(proxy))[0] == 200
    assert "/tokenize" not in backend.paths


async def test_readyz_is_answered_here(proxy_for: Any, smollm2_tokenizer: LoadedTokenizer) -> None:
    backend = TokenizingBackend(smollm2_tokenizer)
    proxy = await proxy_for(backend)
    await readyz(proxy)
    async with proxy.post("/readyz") as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "GET, HEAD"
    async with proxy.head("/readyz") as resp:
        assert resp.status == 200
    assert "/readyz" not in backend.paths


async def test_a_round_failing_midway_stops_asking_and_keeps_the_verdict(
    proxy_for: Any, smollm2_tokenizer: LoadedTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "codec_proxy")
    backend = TokenizingBackend(smollm2_tokenizer)
    proxy = await proxy_for(backend)
    monitor = drift_monitor(proxy)
    backend.tokenize_bodies.clear()
    backend.paths.clear()
    backend.fail_after = 10
    assert not await monitor.check()
    assert not await monitor.check()
    await asyncio.sleep(0.2)
    # The first failure cancels the probes still waiting (4 run at once): far fewer than 383.
    assert 11 <= backend.paths.count("/tokenize") < 30
    assert (await readyz(proxy))[0] == 200  # the last conclusive verdict stands
    warnings = [r for r in caplog.records if "could not conclude" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING, logging.DEBUG]
