"""The proxy's connections, on raw sockets: slow or stalled requests (request_timeout), idle
ones (client_keepalive_timeout), malformed ones (JSON errors like every other), `Expect`, and
clients that half-close after their request."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from proxy.server.data.client_protocol import HALF_CLOSE_GRACE
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.raw_http import Connect, RawResponse, parse, request
from tests.server.support import frames_of

TIMEOUT = 0.5  # request_timeout in these tests
# A connection one of the proxy's timers closes is closed within this: far below what else would
# close it (aiohttp's lingering close, 10 s; the keep-alive timer, an hour, or request_timeout's
# 30 s in the keep-alive test), and far above a loaded machine's delays.
CLOSED_WITHIN = 5.0
COMPLETION = json.dumps({"prompt": "Hi", "max_tokens": 8}).encode()
SAMPLE = "llamacpp-completions-sample.txt"
CODEC = json.dumps({"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}).encode()


def assert_json_error(response: RawResponse, status: int, code: str) -> None:
    assert response.status == status
    assert response.headers["content-type"].startswith("application/json")
    error = json.loads(response.body)["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == code
    assert error["message"]


async def metric(proxy: ProxyClient, needle: str) -> float:
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if needle in line)


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> ProxyClient:
    return await make_proxy(request_timeout=TIMEOUT)


# --- request_timeout: heads -----------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: pro"])
async def test_a_request_head_must_be_complete_within_request_timeout(
    proxy: ProxyClient, connect: Connect, sent: bytes
) -> None:
    """A new connection that sends nothing, or half a head, and stops is closed, unanswered."""
    began = time.monotonic()  # before the proxy accepts: its timer cannot start earlier
    connection = await connect(proxy)
    await connection.send(sent)
    await connection.until_closed(CLOSED_WITHIN)
    assert connection.transcript == b""
    assert time.monotonic() - began >= TIMEOUT  # closed by the timer, not at once
    assert await metric(proxy, 'codec_proxy_timeouts_total{kind="request_head"}') == 1


async def test_a_later_head_is_timed_from_its_first_byte(
    proxy: ProxyClient, connect: Connect, upstream: FakeUpstream
) -> None:
    connection = await connect(proxy)
    await connection.send(request("POST", "/v1/completions", COMPLETION))
    assert (await connection.response()).status == 200
    # Idle longer than request_timeout: a kept-alive connection is not a slow head...
    assert await connection.still_open_after(TIMEOUT * 2)
    # ...but once a head has begun, it has request_timeout to finish.
    began = time.monotonic()
    await connection.send(b"GET /livez HTTP/1.1\r\n")
    await connection.until_closed(CLOSED_WITHIN)
    assert time.monotonic() - began >= TIMEOUT  # timed from that first byte
    assert connection.received == b""
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    "first",
    [
        request("GET", "/livez"),
        request("POST", "/tokenize", b"{}"),
        b"POST /tokenize HTTP/1.1\r\nHost: proxy\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
    ],
    ids=["no-body", "content-length", "chunked"],
)
async def test_a_pipelined_half_head_is_timed_too(
    proxy: ProxyClient, connect: Connect, first: bytes
) -> None:
    """Half a head sent in the same packet as a whole request: llhttp keeps it unsaid."""
    connection = await connect(proxy)
    began = time.monotonic()
    await connection.send(first + b"GET /livez HTTP/1.1\r\nHo")
    assert (await connection.response()).status == 200
    await connection.until_closed(CLOSED_WITHIN)
    assert time.monotonic() - began >= TIMEOUT


@pytest.mark.parametrize(
    "sent",
    [
        [request("POST", "/tokenize", b"{}")],
        [request("POST", "/tokenize", b"{}")[:-2], b"{}"],  # head, then its body
        [
            b"POST /tokenize HTTP/1.1\r\nHost: proxy\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"2\r\n{}\r\n",
            b"0\r\n\r\n",
        ],
    ],
    ids=["one-packet", "head-then-body", "chunked"],
)
async def test_a_kept_alive_connection_outlives_request_timeout(
    proxy: ProxyClient, connect: Connect, sent: list[bytes]
) -> None:
    """Front proxies reuse idle connections: closing one at request_timeout would race them."""
    connection = await connect(proxy)
    for data in sent:
        await connection.send(data)
        await connection.still_open_after(0.05)  # each its own packet
    assert (await connection.response()).status == 200
    assert await connection.still_open_after(TIMEOUT * 3)
    await connection.send(request("GET", "/livez"))
    assert (await connection.response()).status == 200


async def test_client_keepalive_timeout_closes_idle_connections(
    make_proxy: MakeProxy, connect: Connect
) -> None:
    proxy = await make_proxy(client_keepalive_timeout=0.5)
    connection = await connect(proxy)
    await connection.send(request("GET", "/livez"))
    assert (await connection.response()).status == 200
    await connection.until_closed(CLOSED_WITHIN)


# --- request_timeout: bodies ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/completions/codec", "/tokenize"])
async def test_a_stalled_body_gets_408_and_its_connection_closed(
    proxy: ProxyClient, connect: Connect, upstream: FakeUpstream, path: str
) -> None:
    began = time.monotonic()
    connection = await connect(proxy)
    head = f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Length: 100000\r\n\r\n"
    await connection.send(head.encode() + b'{"prompt": "a')
    await connection.until_closed(CLOSED_WITHIN)  # no lingering for the rest of the body
    assert time.monotonic() - began >= TIMEOUT
    response, rest = parse(connection.received)
    assert_json_error(response, 408, "request_timeout")
    assert response.headers["connection"] == "close"
    assert rest == b""
    assert upstream.requests == []
    assert await metric(proxy, 'codec_proxy_timeouts_total{kind="request_body"}') == 1


async def test_a_slow_but_steady_request_is_served(
    make_proxy: MakeProxy, connect: Connect, upstream: FakeUpstream
) -> None:
    """Head and body each within request_timeout, though not both together."""
    proxy = await make_proxy(request_timeout=1.0)
    connection = await connect(proxy)
    data = request("POST", "/v1/completions", COMPLETION)
    head_end = data.index(b"\r\n\r\n") + 4
    for piece in (data[:20], data[20:40], data[40:head_end]):
        await connection.send(piece)
        await connection.still_open_after(0.3)
    for piece in (data[head_end:][:5], data[head_end:][5:10], data[head_end:][10:]):
        await connection.send(piece)
        await connection.still_open_after(0.3)
    response = await connection.response()
    assert response.status == 200
    assert response.body == load_capture(SAMPLE).body
    assert upstream.requests[0].body == COMPLETION


# --- malformed requests, Expect: the one JSON error shape -------------------------------------


@pytest.mark.parametrize(
    "sent",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: proxy\r\nBad Header\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: proxy\r\nContent-Length: x\r\n\r\n",
    ],
    ids=["request-line", "header", "content-length"],
)
async def test_a_malformed_request_gets_a_json_400(
    proxy: ProxyClient, connect: Connect, sent: bytes
) -> None:
    connection = await connect(proxy)
    await connection.send(sent)
    await connection.until_closed()  # where a next request would start is lost: closed
    response, _ = parse(connection.received)
    assert_json_error(response, 400, "malformed_request")


async def test_a_body_that_breaks_its_chunking_gets_a_json_400_at_once(
    make_proxy: MakeProxy, connect: Connect, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(request_timeout=30)
    connection = await connect(proxy)
    await connection.send(
        b"POST /tokenize HTTP/1.1\r\nHost: proxy\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"
    )
    assert await connection.still_open_after(0.1)
    await connection.send(b"zz\r\n")  # not a chunk size
    await connection.until_closed(CLOSED_WITHIN)  # not a 408 after request_timeout (30 s)
    response, _ = parse(connection.received)
    assert_json_error(response, 400, "malformed_body")
    assert upstream.requests == []


async def test_an_unknown_expectation_gets_a_json_417(
    proxy: ProxyClient, connect: Connect, upstream: FakeUpstream
) -> None:
    connection = await connect(proxy)
    await connection.send(request("POST", "/tokenize", b"{}", headers={"Expect": "something"}))
    assert_json_error(await connection.response(), 417, "expectation_failed")
    assert upstream.requests == []


async def test_100_continue_only_once_the_key_is_checked(
    make_proxy: MakeProxy, connect: Connect, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(api_key=("k",))
    head = request("POST", "/tokenize", b"{}", headers={"Expect": "100-continue"})[:-2]
    refused = await connect(proxy)
    await refused.send(head)
    assert_json_error(await refused.response(), 401, "invalid_api_key")
    assert b"100 Continue" not in refused.transcript
    accepted = await connect(proxy)
    await accepted.send(head.replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer k\r\n\r\n"))
    async with asyncio.timeout(2):
        interim = await accepted.reader.readuntil(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    await accepted.send(b"{}")
    assert (await accepted.response()).status == 200
    assert upstream.requests[0].body == b"{}"
    # The expectation was the proxy's to meet, and it met it: the upstream gets the body with
    # no Expect (which would make it send a 100 of its own and wait a round trip for it).
    names = {name.lower() for name, _ in upstream.requests[0].raw_headers}
    assert b"expect" not in names
    assert b"content-length" in names


async def test_a_target_no_route_matches_gets_a_json_404(
    proxy: ProxyClient, connect: Connect
) -> None:
    connection = await connect(proxy)
    await connection.send(request("OPTIONS", "*"))
    assert_json_error(await connection.response(), 404, "not_found")


# --- a client that half-closes after its request --------------------------------------------


@pytest.mark.parametrize("body", [COMPLETION, CODEC], ids=["json", "codec"])
async def test_a_half_closed_client_is_answered(
    proxy: ProxyClient,
    connect: Connect,
    body: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    connection = await connect(proxy)
    await connection.send(request("POST", "/v1/completions", body))
    connection.half_close()
    await connection.until_closed()  # answered, then closed: nothing more can come
    response, rest = parse(connection.received)
    assert response.status == 200
    assert rest == b""
    if body is CODEC:
        assert frames_of(response.body, "msgpack")[-1].finish_reason == "length"
    else:
        assert response.body == load_capture(SAMPLE).body
    (line,) = [r.fields for r in caplog.records if hasattr(r, "fields")]
    assert (line["status"], line["outcome"]) == (200, "ok")  # not a 499


async def test_every_request_before_a_half_close_is_answered(
    proxy: ProxyClient, connect: Connect
) -> None:
    connection = await connect(proxy)
    await connection.send(request("GET", "/livez") + request("GET", "/readyz"))
    connection.half_close()
    await connection.until_closed()
    first, rest = parse(connection.received)
    second, rest = parse(rest)
    assert (first.status, second.status, rest) == (200, 200, b"")


async def test_an_eof_long_after_the_request_is_a_client_that_left(
    proxy: ProxyClient, connect: Connect, upstream: FakeUpstream
) -> None:
    """It cancels the request, so the backend stops generating, as any disconnect does."""
    upstream.script = Script(load_capture(SAMPLE), header_delay=60.0)
    connection = await connect(proxy)
    await connection.send(request("POST", "/v1/completions", CODEC))
    await asyncio.sleep(HALF_CLOSE_GRACE + 0.2)
    connection.half_close()
    await connection.until_closed(CLOSED_WITHIN)  # not once the upstream answers
    assert connection.transcript == b""
    for _ in range(int(CLOSED_WITHIN / 0.01)):  # the upstream request is closed too
        if upstream.outcomes:
            break
        await asyncio.sleep(0.01)
    assert upstream.outcomes == ["aborted"]
    assert await metric(proxy, "codec_proxy_client_disconnects_total{") == 1


async def test_a_half_close_mid_body_closes_at_once(
    make_proxy: MakeProxy, connect: Connect, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(request_timeout=30)
    connection = await connect(proxy)
    await connection.send(request("POST", "/v1/completions", COMPLETION)[:-3])
    connection.half_close()
    await connection.until_closed(CLOSED_WITHIN)  # not left for the body timeout (30 s)
    assert connection.transcript == b""
    assert upstream.requests == []
