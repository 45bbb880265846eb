"""Requests that do not ask for Codec go upstream and back byte for byte."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import pytest
from yarl import URL

from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import ProxyClient

# What the data plane does with a stream, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

STREAMS = [
    "llamacpp-completions-sample-with-headers.txt",
    "llamacpp-completions-logprobs.txt",
    "vllm-completions-sample.txt",
    "vllm-completions-token-ids.txt",
]


async def direct(url: str, path: str, payload: bytes) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url + path, data=payload) as resp:
            return resp.status, await resp.read(), dict(resp.headers)


@pytest.mark.parametrize("capture_name", STREAMS)
@pytest.mark.parametrize(
    "payload",
    [{"prompt": "Hi", "stream": True}, {"prompt": "Hi", "stream": True, "stream_format": "json"}],
)
async def test_json_stream_is_byte_identical(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    upstream_url: str,
    capture_name: str,
    payload: dict[str, object],
) -> None:
    upstream.script = Script(load_capture(capture_name), chunk_size=61)
    raw = json.dumps(payload).encode()
    async with proxy.post("/v1/completions", data=raw) as resp:
        via_proxy = await resp.read()
        proxy_headers = resp.headers
    _, straight, direct_headers = await direct(upstream_url, "/v1/completions", raw)
    assert hashlib.sha256(via_proxy).hexdigest() == hashlib.sha256(straight).hexdigest()
    assert proxy_headers["Content-Type"] == direct_headers["Content-Type"]
    # The request went up unchanged too.
    assert upstream.requests[0].body == raw


async def test_upstream_errors_and_headers_pass_through(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    capture = load_capture("llamacpp-error-bad-json.txt")
    upstream.script = Script(capture)
    async with proxy.post("/v1/completions", data=b'{"prompt": "x"}') as resp:
        assert resp.status == 400
        assert await resp.read() == capture.body
        assert resp.headers["Server"] == "llama.cpp"
        assert resp.headers["Content-Type"] == "application/json; charset=utf-8"


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/tokenize?add_special=false&x=%2F"])
async def test_other_paths_are_relayed(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    path: str,
) -> None:
    method = "POST" if path.startswith("/tokenize") else "GET"
    # encoded=True: send the target exactly as written (the test client would re-quote it).
    url = URL(str(proxy.make_url("")).rstrip("/") + path, encoded=True)
    data = b'{"content": "hi"}' if method == "POST" else None
    async with proxy.session.request(method, url, data=data) as resp:
        assert resp.status == 200
        await resp.read()
    (seen,) = upstream.requests
    assert seen.method == method
    assert seen.path_qs == path  # the query string exactly as sent


async def test_hop_by_hop_headers_are_not_forwarded(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    headers = {
        "Connection": "keep-alive, X-Private",
        "X-Private": "secret-for-this-hop",
        "Keep-Alive": "timeout=5",
        "Authorization": "Bearer abc",
        "X-Request-Id": "r-1",
        "TE": "trailers",
    }
    no_defaults = ("User-Agent", "Accept", "Accept-Encoding")
    async with proxy.get("/v1/models", headers=headers, skip_auto_headers=no_defaults) as resp:
        await resp.read()
    seen = {k.lower(): v for k, v in upstream.requests[0].headers.items()}
    assert seen["authorization"] == "Bearer abc"
    assert seen["x-request-id"] == "r-1"
    for dropped in ("x-private", "keep-alive", "te"):
        assert dropped not in seen
    # The proxy's own HTTP client adds none of its defaults either.
    for added in ("user-agent", "accept", "accept-encoding"):
        assert added not in seen


async def test_compressed_upstream_body_is_not_decompressed(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    import gzip

    body = gzip.compress(b'{"ok": true}')
    capture = load_capture("llamacpp-tokenize.txt")
    upstream.script = Script(
        capture.__class__(
            200, "OK", (("Content-Type", "application/json"), ("Content-Encoding", "gzip")), body
        )
    )
    url = proxy.make_url("/v1/completions")
    async with aiohttp.ClientSession(auto_decompress=False) as raw_client:
        headers = {"Accept-Encoding": "gzip"}
        async with raw_client.post(url, data=b'{"prompt": "x"}', headers=headers) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            assert await resp.read() == body


async def raw_exchange(proxy: ProxyClient, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(head)
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return response


async def test_utf8_header_bytes_are_relayed_as_received(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    value = "café ☕ 日本".encode()
    response = await raw_exchange(
        proxy, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Name: " + value
        + b"\r\n\r\n",
    )  # fmt: skip
    assert response.startswith(b"HTTP/1.1 200")
    assert (b"X-Name", value) in upstream.requests[0].raw_headers


async def test_header_bytes_that_cannot_be_relayed_unchanged_are_a_json_400(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    # Latin-1 "café": aiohttp writes header values as UTF-8, so these bytes could only be sent
    # changed (c3 a9 for e9); refused instead, before the upstream sees anything.
    response = await raw_exchange(
        proxy, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Name: caf\xe9\r\n\r\n"
    )
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["code"] == "invalid_header_bytes"
    assert upstream.requests == []
