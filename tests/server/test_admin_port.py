"""`admin_port`: the proxy's own probes and metrics on a port of their own, and the serving port
relaying `/metrics` and the probes' paths to the backend, as an endpoint picker needs
(proxy/server/control/admin.py, docs/DEPLOY.md "Behind an endpoint picker")."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.core.backend.readiness import Check
from proxy.server import create_app
from proxy.server.app import routes
from proxy.server.control.admin import ADMIN_APP
from proxy.server.control.local import DOCUMENT_PATHS, PROBE_PATHS, livez, metrics, readyz
from proxy.server.data.drain import READINESS
from proxy.settings import Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import BACKEND_METRICS, FakeUpstream
from tests.server.conftest import AiohttpClient, ProxyClient, app_of

KEY = {"Authorization": "Bearer k"}


def families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream(paths={"/metrics": BACKEND_METRICS})


async def serving_and_admin(
    settings: Settings, vocabulary: Vocabulary, aiohttp_client: AiohttpClient, **changes: Any
) -> tuple[ProxyClient, ProxyClient]:
    # Any admin port: it only has to be set, since test servers listen where they choose.
    app = create_app(Settings(**{**vars(settings), "admin_port": 1, **changes}), vocabulary)
    serving = await aiohttp_client(app)  # started first: the admin app runs on its state
    return serving, await aiohttp_client(app[ADMIN_APP])


@pytest.fixture
async def ports(
    settings: Settings, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> tuple[ProxyClient, ProxyClient]:
    return await serving_and_admin(settings, smollm2_vocabulary, aiohttp_client)


async def test_the_serving_port_relays_the_backends_metrics_byte_for_byte(
    ports: tuple[ProxyClient, ProxyClient], upstream: FakeUpstream
) -> None:
    serving, admin = ports
    async with serving.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == dict(BACKEND_METRICS.headers)["Content-Type"]
        assert await resp.read() == BACKEND_METRICS.body
    assert [(r.method, r.path_qs) for r in upstream.requests] == [("GET", "/metrics")]
    # The proxy's own are on the admin port, and they counted the relayed scrape.
    async with admin.get("/metrics") as resp:
        assert resp.status == 200
        own = await resp.text()
    assert "codec_proxy_requests" in families(own)
    assert not families(own) & families(BACKEND_METRICS.body.decode())
    assert 'route="relay",status="200"' in own


@pytest.mark.parametrize("path", PROBE_PATHS)
@pytest.mark.parametrize("method", ["GET", "POST", "HEAD"])
async def test_no_probe_path_is_answered_locally_on_the_serving_port(
    ports: tuple[ProxyClient, ProxyClient], upstream: FakeUpstream, path: str, method: str
) -> None:
    serving, _ = ports
    async with serving.request(method, path) as resp:
        status = resp.status
        await resp.read()
    # Whatever the backend answers (its /livez is this fake's replayed stream), it answered it.
    assert [(r.method, r.path_qs) for r in upstream.requests] == [(method, path)]
    assert status == 200


async def test_probes_answer_on_the_admin_port(
    ports: tuple[ProxyClient, ProxyClient], upstream: FakeUpstream
) -> None:
    serving, admin = ports
    async with admin.get("/livez") as resp:
        assert (resp.status, (await resp.json())["status"]) == (200, "alive")
    async with admin.get("/readyz") as resp:
        assert resp.status == 200
    # The serving app's readiness is the admin app's: a drain there is a 503 here.
    app_of(serving)[READINESS].update(
        Check("draining", ready=False, reason="draining", detail="shutting down")
    )
    async with admin.get("/readyz") as resp:
        assert resp.status == 503
        assert (await resp.json())["reasons"][0]["reason"] == "draining"
    for method in ("POST", "DELETE"):
        async with admin.request(method, "/metrics") as resp:
            assert (resp.status, resp.headers["Allow"]) == (405, "GET, HEAD")
    assert upstream.requests == []


@pytest.mark.parametrize("path", DOCUMENT_PATHS)
async def test_the_codec_documents_stay_on_the_serving_port(
    ports: tuple[ProxyClient, ProxyClient], upstream: FakeUpstream, path: str
) -> None:
    serving, admin = ports
    async with serving.get(path) as resp:
        assert resp.status == 200
    async with admin.get(path) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"
    assert upstream.requests == []


async def test_keys_guard_the_relayed_paths_and_not_the_admin_port(
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
    upstream: FakeUpstream,
) -> None:
    """docs/ENDPOINTS.md: open is what the proxy answers itself. On the serving port these
    paths are relayed, so they need a key like any relayed route; the admin port needs none."""
    serving, admin = await serving_and_admin(
        settings, smollm2_vocabulary, aiohttp_client, api_key=("k",)
    )
    for path in PROBE_PATHS:
        async with serving.get(path) as resp:
            assert resp.status == 401, path
        async with admin.get(path) as resp:
            assert resp.status == 200, path
    assert upstream.requests == []
    async with serving.get("/metrics", headers=KEY) as resp:
        assert await resp.read() == BACKEND_METRICS.body


def test_without_an_admin_port_nothing_moves() -> None:
    """The serving port answers the probes itself, and there is no admin app."""
    served = {(r.method, r.path): r.handler for r in routes()}
    assert served[("GET", "/livez")] is livez
    assert served[("GET", "/readyz")] is readyz
    assert served[("GET", "/metrics")] is metrics
    relayed = {(r.method, r.path): r.handler for r in routes(probes=False)}
    assert {("GET", path) for path in PROBE_PATHS}.isdisjoint(relayed)


async def test_without_an_admin_port_the_app_has_no_admin_app(proxy: ProxyClient) -> None:
    assert ADMIN_APP not in app_of(proxy)
    async with proxy.get("/metrics") as resp:
        assert "codec_proxy_requests" in families(await resp.text())


def test_the_admin_port_is_not_the_serving_port(settings: Settings) -> None:
    with pytest.raises(ValueError, match="'admin_port' 8080 is also 'port'"):
        Settings(**{**vars(settings), "port": 8080, "admin_port": 8080})
    assert Settings(**{**vars(settings), "admin_port": 9090}).probe_port == 9090
    assert settings.probe_port == settings.port
