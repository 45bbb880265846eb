"""Stream budgets: each model's share of `max_streams`, and `max_streams` over them all
(proxy/server/data/upstreams.py `StreamBudget`).

Each model has its own fake backend; a stalling one answers the first event of a stream and
then holds it open, as a backend that hangs mid-generation does, until the proxy hangs up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.server import create_app
from proxy.server.data.upstreams import ProcessStreams
from proxy.server.models.served_models import SERVED_MODELS
from proxy.settings import ModelSettings, Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    ProxyClient,
    app_of,
)

CAPTURE = "llamacpp-completions-sample.txt"
STALL_SECONDS = 600.0  # longer than any test: a stream ends when the proxy hangs up
# A client's EOF this soon after its request is taken for a half-close, not for leaving
# (proxy/server/data/connection.py): a held stream is closed only once this has passed.
PAST_HALF_CLOSE = 0.3


def request(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Hi", "max_tokens": 8, "stream": True}


def stalling() -> FakeUpstream:
    return FakeUpstream(
        script=Script(load_capture(CAPTURE), stall_after_events=1, stall_seconds=STALL_SECONDS)
    )


@dataclass
class Proxy:
    """The proxy under test, and the streams a test holds open (each holds a budget)."""

    client: ProxyClient
    held: list[aiohttp.ClientResponse] = field(default_factory=list)

    @property
    def process(self) -> ProcessStreams:
        return app_of(self.client)[SERVED_MODELS].default.pool.budget.process

    async def hold(self, model: str) -> bool:
        """One stream of `model` that its backend holds open, its response begun; False when
        the request was refused instead."""
        response = await self.client.post("/v1/completions", json=request(model))
        if response.status != 200:
            response.close()
            return False
        self.held.append(response)
        return True

    async def close(self, responses: list[aiohttp.ClientResponse]) -> None:
        """Leave those streams, and wait until the proxy has given their budgets back."""
        await asyncio.sleep(PAST_HALF_CLOSE)
        goal = self.process.in_flight - len(responses)
        for response in responses:
            self.held.remove(response)
            response.close()
        for _ in range(300):
            if self.process.in_flight <= goal:
                return
            await asyncio.sleep(0.01)
        pytest.fail(f"streams closed 3 s ago still hold budgets ({self.process})")

    async def refused(self, model: str) -> dict[str, Any]:
        async with self.client.post("/v1/completions", json=request(model)) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            error: dict[str, Any] = json.loads(await response.read())["error"]
        assert error["code"] == "overloaded"
        return error

    async def served(self, model: str) -> None:
        async with self.client.post("/v1/completions", json=request(model)) as response:
            assert response.status == 200
            assert await response.read() == load_capture(CAPTURE).body

    async def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        async with self.client.get("/metrics") as response:
            text = await response.text()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


Start = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def start(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
) -> AsyncIterator[Start]:
    """The proxy in front of one backend per model, each entry changed by
    `entries={name: {key: value}}`. The streams held open are closed after the test (else
    the proxy would drain them for `drain_timeout` as it stops)."""
    started: list[Proxy] = []

    async def make(
        backends: dict[str, FakeUpstream],
        entries: dict[str, dict[str, Any]] | None = None,
        **changes: Any,
    ) -> Proxy:
        models = []
        for name, backend in backends.items():
            server = await aiohttp_server(backend.app())
            url = str(server.make_url("")).rstrip("/")
            own = (entries or {}).get(name, {})
            models.append(ModelSettings(name, (url,), smollm2_gguf, **own))
        settings = pinned_draws.settings(models=tuple(models), drift_check=False, **changes)
        vocabularies = dict.fromkeys(backends, smollm2_vocabulary)
        client = await aiohttp_client(create_app(settings, vocabularies))
        started.append(Proxy(client))
        return started[-1]

    yield make
    for proxy in started:
        await proxy.close(list(proxy.held))


def shed(model: str, budget: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return ("codec_proxy_load_shed_total", frozenset({("model", model), ("budget", budget)}))


def share(model: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return ("codec_proxy_model_max_streams", frozenset({("model", model)}))


async def test_a_stalled_model_leaves_the_others_their_streams(start: Start) -> None:
    a, b = stalling(), FakeUpstream()
    proxy = await start({"a": a, "b": b}, max_streams=8)
    # a's clients keep asking while its backend holds every stream open, until refused.
    streams = 0
    while await proxy.hold("a"):
        streams += 1
        assert streams <= 8, "a's requests were never refused"
    # b is served, JSON and Codec alike, as often as it asks.
    for _ in range(5):
        await proxy.served("b")
    codec = {**request("b"), "stream_format": "msgpack"}
    async with proxy.client.post("/v1/completions", json=codec) as response:
        assert response.status == 200
        await response.read()
    # a held its share, by default half of max_streams with two models, and no more.
    assert streams == len(a.stalled_at) == 4
    error = await proxy.refused("a")
    assert "for model 'a' (its share of max_streams)" in error["message"]
    metrics = await proxy.samples()
    assert metrics[shed("a", "model")] == 2
    assert metrics[shed("a", "process")] == metrics[shed("b", "model")] == 0
    assert metrics[share("a")] == metrics[share("b")] == 4
    assert metrics[("codec_proxy_max_streams", frozenset())] == 8
    # What an operator compares with a's share: its streams in flight.
    active = ("codec_proxy_active_streams", frozenset({("mode", "passthrough"), ("model", "a")}))
    assert metrics[active] == 4


async def test_a_models_own_share_is_enforced(start: Start) -> None:
    proxy = await start(
        {"a": stalling(), "b": FakeUpstream()}, entries={"a": {"max_streams": 2}}, max_streams=8
    )
    for _ in range(2):
        assert await proxy.hold("a")
    assert "for model 'a'" in (await proxy.refused("a"))["message"]
    # One of its streams ends: there is room for one more.
    await proxy.close(proxy.held[:1])
    assert await proxy.hold("a")
    assert "for model 'a'" in (await proxy.refused("a"))["message"]
    metrics = await proxy.samples()
    assert metrics[share("a")] == 2
    assert metrics[share("b")] == 4
    assert metrics[shed("a", "model")] == 2


async def test_max_streams_still_holds_for_every_model_together(start: Start) -> None:
    # Shares that add up to more than the process may hold: the process's cap decides.
    proxy = await start(
        {"a": stalling(), "b": stalling()},
        entries={"a": {"max_streams": 3}, "b": {"max_streams": 3}},
        max_streams=3,
    )
    for model in ("a", "a", "b"):
        assert await proxy.hold(model)
    for model in ("a", "b"):
        error = await proxy.refused(model)
        assert "for every model together (max_streams)" in error["message"]
    metrics = await proxy.samples()
    assert metrics[shed("a", "process")] == metrics[shed("b", "process")] == 1
    assert metrics[shed("a", "model")] == 0


def test_the_default_share() -> None:
    url = ("http://u",)
    one = Settings(models=(ModelSettings("a", url, Path("t")),), max_streams=9)
    assert [m.max_streams for m in one.model_list()] == [9]
    several = Settings(
        models=(
            ModelSettings("a", url, Path("t")),
            ModelSettings("b", url, Path("t"), max_streams=20),
            ModelSettings("c", url, Path("t")),
        ),
        max_streams=9,
    )
    assert [m.max_streams for m in several.model_list()] == [5, 20, 5]
    single = Settings(upstream=url, tokenizer=Path("t"), max_streams=9)
    assert [m.max_streams for m in single.model_list()] == [9]
