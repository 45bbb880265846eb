"""Local API keys: what is open, what is answered locally, what goes upstream, the challenge."""

from __future__ import annotations

import pytest

from proxy.server.control.local import DOCUMENT_PATHS, LOCAL_PATHS
from tests.fake_upstream import FakeUpstream
from tests.server.conftest import MakeProxy, ProxyClient

KEY = {"Authorization": "Bearer k"}


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> ProxyClient:
    return await make_proxy(api_key=("k",))


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_path_the_router_does_not_send_to_a_local_route_needs_a_key(
    proxy: ProxyClient, upstream: FakeUpstream, method: str
) -> None:
    """`/codec%2Fschema` decodes to a local path but is routed upstream: it is not open."""
    url = proxy.make_url("/codec%2Fschema")
    async with proxy.session.request(method, url) as resp:
        assert resp.status == 401
    assert upstream.requests == []
    async with proxy.session.request(method, url, headers=KEY) as resp:
        assert resp.status == 200
    assert upstream.requests[0].path_qs == "/codec%2Fschema"


@pytest.mark.parametrize("path", LOCAL_PATHS)
async def test_every_method_of_a_local_route_is_answered_locally_without_a_key(
    proxy: ProxyClient, upstream: FakeUpstream, path: str
) -> None:
    # The Codec documents answer a CORS preflight, as the discovery documents do.
    document = path in DOCUMENT_PATHS
    allowed = "GET, HEAD, OPTIONS" if document else "GET, HEAD"
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"):
        if method in allowed:
            continue
        async with proxy.request(method, path) as resp:
            assert resp.status == 405, method
            assert resp.headers["Allow"] == allowed
            assert (await resp.json())["error"]["code"] == "method_not_allowed"
    for method in ("GET", "HEAD", *(["OPTIONS"] if document else [])):
        async with proxy.request(method, path) as resp:
            assert resp.status == (204 if method == "OPTIONS" else 200), method
            if document:
                assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert upstream.requests == []


async def test_the_proxy_key_is_not_sent_upstream(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    async with proxy.post("/v1/completions", json={"prompt": "Hi"}, headers=KEY) as resp:
        assert resp.status == 200
        await resp.read()
    codec = {"prompt": "Hi", "stream_format": "msgpack"}
    async with proxy.post("/v1/completions", json=codec, headers=KEY) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(upstream.requests) == 2
    for sent in upstream.requests:
        assert "authorization" not in {name.lower() for name in sent.headers}


async def test_forward_authorization_sends_it_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(api_key=("k",), forward_authorization=True)
    async with proxy.get("/v1/models", headers=KEY) as resp:
        assert resp.status == 200
    assert upstream.requests[0].headers["Authorization"] == "Bearer k"


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="codec-proxy"'),
        ({"Authorization": "Basic azpr"}, 'Bearer realm="codec-proxy"'),
        ({"Authorization": "Bearer wrong"}, 'Bearer realm="codec-proxy", error="invalid_token"'),
    ],
    ids=["missing", "other-scheme", "wrong"],
)
async def test_401_carries_a_bearer_challenge(
    proxy: ProxyClient, headers: dict[str, str], challenge: str
) -> None:
    async with proxy.get("/v1/models", headers=headers) as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == challenge
        error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
