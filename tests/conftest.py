"""Shared fixtures: cached real assets and the real llama.cpp backend (one per test session)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, settings

from proxy import assets
from proxy.embedded import EmbeddedBackend
from proxy.server.models.live import LIVE
from proxy.server.process.runner import ProxyRunner
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws

# `ci` keeps the whole of `make test` within its 15-minute budget on 2 cores; run the deep profile
# (HYPOTHESIS_PROFILE=deep) after touching a parser or the retokenizer.
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("deep", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return assets.SMOLLM2_GGUF.ensure()


@pytest.fixture(scope="session")
def llama_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a real llama.cpp server running SmolLM2-135M-Instruct on 127.0.0.1."""
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with EmbeddedBackend(smollm2_gguf, parallel=4, log_path=log) as backend:
        yield backend.url


@pytest.fixture(scope="session")
def second_llama_server(
    smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Another real llama.cpp server with the same model, for a second model behind one proxy
    (tests/test_e2e_models_llamacpp.py). Small: two slots, a short context."""
    log = tmp_path_factory.mktemp("llama-2") / "server.log"
    with EmbeddedBackend(smollm2_gguf, parallel=2, ctx_size=2048, log_path=log) as backend:
        yield backend.url


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: Path) -> LoadedTokenizer:
    """The bundled model's tokenizer, read from its GGUF as the proxy does."""
    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_vocabulary(smollm2_tokenizer: LoadedTokenizer) -> Vocabulary:
    """The tokenizer plus its retokenizer scheme, built once (it takes about a second)."""
    return Vocabulary.build(smollm2_tokenizer)


@pytest.fixture(scope="session")
def qwen3_vocabulary() -> Vocabulary:
    """Qwen3's tokenizer.json (another family than SmolLM2: 151k IDs, its own pre-tokenizer),
    for a second model behind one proxy. Built once: it takes about five seconds."""
    return Vocabulary.build(load_tokenizer(assets.QWEN3_TOKENIZER.ensure()))


@pytest.fixture(autouse=True)
def otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `OTEL_*` variable of the shell running the tests reaches a proxy (a sampler that
    draws, an exporter elsewhere): only what a test sets."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def draws_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `codec-proxy` process a test starts, and every configuration read from this
    process's environment, has the drawn settings at 0 (tests/pinned_draws.py); a test that
    samples sets its own value."""
    for name, value in pinned_draws.environment().items():
        monkeypatch.setenv(name, value)


class ProxyTestServer(TestServer):
    """The app served as `codec-proxy serve` serves it: on the proxy's own connections, whose
    streams are told at once when their client pauses, resumes or leaves. Its settings draw
    nothing at random (tests/pinned_draws.py)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        pinned_draws.check(app[LIVE].current.settings, "the proxy app under test")
        super().__init__(app, **kwargs)

    async def _make_runner(self, **kwargs: Any) -> ProxyRunner:
        return ProxyRunner(self.app, **kwargs)


@pytest.fixture
def aiohttp_client(
    aiohttp_client: Callable[..., Awaitable[TestClient[web.Request, web.Application]]],
) -> Iterator[Callable[..., Awaitable[TestClient[web.Request, web.Application]]]]:
    """pytest-aiohttp's, serving a codec-proxy app on the proxy's own connections (as
    `codec-proxy serve` does) and any other app as it would. A proxy app that a reload left
    drawing at random fails the test too."""
    served: list[web.Application] = []

    async def client(
        app_or_server: web.Application | TestServer, **kwargs: Any
    ) -> TestClient[web.Request, web.Application]:
        if isinstance(app_or_server, web.Application) and LIVE in app_or_server:
            app = app_or_server
            app_or_server = ProxyTestServer(app)
            served.append(app)
        return await aiohttp_client(app_or_server, **kwargs)

    yield client
    for app in served:
        pinned_draws.check(app[LIVE].current.settings, "the proxy app under test, reloaded,")
