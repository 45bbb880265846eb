"""The proxy in process, in front of a fake upstream that replays real captured streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.core.steady import NATIVE
from proxy.server import create_app
from proxy.server.data import stream
from proxy.server.models.drift import DriftMonitor
from proxy.server.models.served_models import SERVED_MODELS, ServedModel
from proxy.settings import Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import FakeUpstream
from tests.server.raw_http import Connect, connections
from tests.server.raw_upstream import StartUpstream, raw_upstreams

AiohttpServer = Callable[..., Awaitable[TestServer]]
ProxyClient = TestClient[web.Request, web.Application]
AiohttpClient = Callable[..., Awaitable[ProxyClient]]
MakeProxy = Callable[..., Awaitable[ProxyClient]]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Tests marked `uvloop_too` run on uvloop as well (what `codec-proxy serve` runs on by
    default), every other one on asyncio's own loop only."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if item.get_closest_marker("uvloop_too") is not None:
        import uvloop

        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def upstream_url(upstream: FakeUpstream, aiohttp_server: AiohttpServer) -> str:
    server = await aiohttp_server(upstream.app())
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
def settings(upstream_url: str, smollm2_gguf: Path) -> Settings:
    # The fake replays captured streams on every path, /tokenize included: no drift check
    # here (tests/server/test_drift.py runs it against fakes that do tokenize).
    return pinned_draws.settings(
        upstream=(upstream_url,), tokenizer=smollm2_gguf, drift_check=False
    )


@pytest.fixture
async def proxy(
    settings: Settings, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    """A client talking to the proxy, which talks to the fake upstream."""
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


@pytest.fixture
def make_proxy(
    settings: Settings, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> MakeProxy:
    """A proxy with some settings changed."""

    async def make(**changes: Any) -> ProxyClient:
        app = create_app(replace(settings, **changes), smollm2_vocabulary)
        return await aiohttp_client(app)

    return make


def app_of(client: ProxyClient) -> web.Application:
    """The application a test client serves."""
    app = client.app
    assert app is not None
    return app


def default_model(client: ProxyClient | web.Application) -> ServedModel:
    """The default model of a proxy (the only one of a single-model proxy)."""
    app = client if isinstance(client, web.Application) else app_of(client)
    return app[SERVED_MODELS].default


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Raw HTTP/1.1 connections to a proxy (tests/server/raw_http.py), closed after the test."""
    async with connections() as connect:
        yield connect


@pytest.fixture
async def raw_upstream() -> AsyncIterator[StartUpstream]:
    """Upstreams on bare sockets (tests/server/raw_upstream.py), stopped after the test."""
    async with raw_upstreams() as start:
        yield start


def drift_monitor(client: ProxyClient) -> DriftMonitor:
    """The default model's drift monitor (the drift check is on)."""
    monitor = default_model(client).drift
    assert monitor is not None
    return monitor


# The paths a steady upstream read can take: the Python body always, the native step when it
# is built (proxy/core/steady). Tests that use `data_path` run on each, as aiohttp's run on its
# C and its Python parser.
DATA_PATHS = ("python", "native") if NATIVE is not None else ("python",)


@pytest.fixture(params=DATA_PATHS)
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`python`: no stream gets the native step (as with CODEC_PROXY_NO_EXTENSIONS=1)."""
    path: str = request.param
    if path == "python":
        monkeypatch.setattr(stream, "native_body", lambda body: None)
    return path
