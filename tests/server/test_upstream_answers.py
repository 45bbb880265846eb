"""Upstream answers the proxy must not relay as they are.

Heads that llhttp parses but the proxy cannot relay (proxy/core/http/response_head.py): a 502
with one bounded log line, or the status with the proxy's own reason phrase; never a traceback,
never a 101 or a status outside 100-599 for a client, never a body read to the close while the
proxy thinks it is chunked. And an upstream that answers one request twice: on a kept-alive
connection nothing tells its late answer from the next request's (docs/DEPLOY.md).
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.raw_http import Connect, RawResponse, parse
from tests.server.raw_upstream import Answer, StartUpstream, json_answer
from tests.server.support import access_line

pytestmark = pytest.mark.uvloop_too

BAD = b"a prompt the upstream answers badly"

MALFORMED = {
    "status-99": b"HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nhi",
    "status-600": b"HTTP/1.1 600 High\r\nContent-Length: 2\r\n\r\nhi",
    "status-999": b"HTTP/1.1 999 High\r\nContent-Length: 2\r\n\r\nhi",
    # Nothing the proxy sends asks for an upgrade (`Upgrade` is hop-by-hop).
    "101-upgrade": b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
    b"Upgrade: websocket\r\n\r\nnot http any more",
    "101-bare": b"HTTP/1.1 101 Switching Protocols\r\n\r\nnot http any more",
    # llhttp reads these bodies until the close while the head says chunked (RFC 9112 §6.3).
    "xchunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "chunked-identity": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    # De-chunked, still gzip'd: relayed, the client would take it for the content.
    "gzip-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
}

LONG = b"x" * 5000
REASONS = {
    "control": (b"HTTP/1.1 200 O\x01K", 200, "OK"),
    "delete": (b"HTTP/1.1 404 Not\x7fFound", 404, "Not Found"),
    "long": (b"HTTP/1.1 200 " + LONG, 200, "OK"),
}

PAYLOADS = {
    "json": {"prompt": BAD.decode(), "max_tokens": 4},
    "codec": {"prompt": BAD.decode(), "max_tokens": 4, "stream_format": "msgpack"},
}


def answering(bad: bytes) -> Answer:
    """An upstream's answers: `bad` to the bad prompt, a whole JSON answer to anything else."""

    def answer(body: bytes) -> bytes | None:
        return bad if BAD in body else json_answer()

    return answer


async def send(
    proxy: ProxyClient, connect: Connect, payload: dict[str, object]
) -> tuple[bytes, RawResponse]:
    """POST `payload` on a connection of its own: the status line as sent, and the response."""
    conn = await connect(proxy)
    body = json.dumps(payload).encode()
    await conn.send(
        b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await conn.until_closed()
    status_line = conn.transcript.split(b"\r\n", 1)[0]
    response, _ = parse(conn.transcript)
    return status_line, response


def problems(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What was logged at WARNING or above, by the proxy or by asyncio, access lines aside."""
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name in ("codec_proxy", "asyncio")
    ]


async def metrics_text(proxy: ProxyClient) -> str:
    async with proxy.get("/metrics") as resp:
        return await resp.text()


@pytest.mark.parametrize("kind", list(PAYLOADS))
@pytest.mark.parametrize("name", list(MALFORMED))
async def test_a_head_the_proxy_cannot_relay_is_a_502_logged_once(
    make_proxy: MakeProxy,
    raw_upstream: StartUpstream,
    connect: Connect,
    caplog: pytest.LogCaptureFixture,
    name: str,
    kind: str,
) -> None:
    upstream = await raw_upstream(answering(MALFORMED[name]))
    proxy = await make_proxy(upstream=(upstream.url,), health_interval=60)
    caplog.set_level(logging.INFO)
    caplog.clear()
    _, response = await send(proxy, connect, PAYLOADS[kind])
    assert response.status == 502
    assert json.loads(response.body)["error"]["type"] == "upstream_error"
    logged = problems(caplog)
    assert [r.levelno for r in logged] == [logging.WARNING]  # one line, no "Fatal error"
    assert logged[0].exc_info is None  # no traceback
    assert "malformed response head" in logged[0].getMessage()
    assert len(logged[0].getMessage()) < 400
    assert (await access_line(caplog))["status"] == 502
    text = await metrics_text(proxy)
    assert 'codec_proxy_upstream_errors_total{kind="protocol",model="default"} 1.0' in text
    # The connection it came on is gone; the upstream's next answer is served.
    _, response = await send(proxy, connect, {"prompt": "Hi"})
    assert response.status == 200


@pytest.mark.parametrize("name", list(REASONS))
async def test_a_reason_phrase_the_proxy_cannot_repeat_gives_way_to_its_own(
    make_proxy: MakeProxy,
    raw_upstream: StartUpstream,
    connect: Connect,
    caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    status_line, status, phrase = REASONS[name]
    answer = status_line + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    upstream = await raw_upstream(answering(answer))
    proxy = await make_proxy(upstream=(upstream.url,), health_interval=60)
    caplog.set_level(logging.INFO)
    caplog.clear()
    sent, response = await send(proxy, connect, PAYLOADS["json"])
    assert sent == f"HTTP/1.1 {status} {phrase}".encode()
    assert (response.status, response.body) == (status, b"{}")
    logged = problems(caplog)
    assert [r.levelno for r in logged] == [logging.WARNING]
    assert logged[0].exc_info is None
    assert "reason phrase" in logged[0].getMessage()
    assert len(logged[0].getMessage()) < 400
    line = await access_line(caplog)
    assert (line["status"], line["outcome"]) == (status, "ok")


async def test_a_codec_request_answered_with_an_error_gets_it_with_a_clean_reason_phrase(
    make_proxy: MakeProxy, raw_upstream: StartUpstream, connect: Connect
) -> None:
    error = b'{"error": {"message": "no", "type": "invalid_request_error", "code": 400}}'
    answer = b"HTTP/1.1 400 Bad\x01Request\r\nContent-Type: application/json\r\n"
    answer += b"Content-Length: %d\r\n\r\n%b" % (len(error), error)
    upstream = await raw_upstream(answering(answer))
    proxy = await make_proxy(upstream=(upstream.url,), health_interval=60)
    sent, response = await send(proxy, connect, PAYLOADS["codec"])
    assert sent == b"HTTP/1.1 400 Bad Request"
    assert response.body == error


@pytest.mark.parametrize("reason", [b"Fine\tthanks", b"~" * 128])
async def test_a_printable_reason_phrase_is_relayed_as_sent(
    make_proxy: MakeProxy, raw_upstream: StartUpstream, connect: Connect, reason: bytes
) -> None:
    answer = b"HTTP/1.1 200 " + reason + b"\r\nContent-Length: 2\r\n\r\n{}"
    upstream = await raw_upstream(answering(answer))
    proxy = await make_proxy(upstream=(upstream.url,), health_interval=60)
    sent, _ = await send(proxy, connect, PAYLOADS["json"])
    assert sent == b"HTTP/1.1 200 " + reason


def echo(body: bytes) -> bytes | None:
    """Each request's answer is its own body: which request an answer belongs to is plain."""
    return json_answer(body)


@pytest.mark.parametrize("keepalive_timeout", [4.0, 0.0], ids=["kept-alive", "no-keep-alive"])
async def test_a_late_second_answer_is_the_next_requests_on_a_kept_alive_connection(
    make_proxy: MakeProxy, raw_upstream: StartUpstream, keepalive_timeout: float
) -> None:
    # Each answer takes 0.5 s and comes again 0.3 s later. A request sent on that connection
    # in between gets the repeated answer (HTTP/1.1 ties an answer to nothing but its place on
    # the connection); the upstream's own answer to it then comes with no request to answer
    # and closes the connection. With keepalive_timeout = 0 no connection carries a second one.
    upstream = await raw_upstream(echo, delay=0.5, again_after=0.3)
    proxy = await make_proxy(
        upstream=(upstream.url,), health_interval=60, keepalive_timeout=keepalive_timeout
    )
    misdelivered = 0
    for round_ in range(2):
        for which in ("first", "second"):
            sent = {"prompt": f"{which} of round {round_}"}
            async with proxy.post("/v1/completions", json=sent) as resp:
                assert resp.status == 200
                misdelivered += await resp.json() != sent
        await asyncio.sleep(0.6)  # the strays have come and gone
    assert misdelivered == (2 if keepalive_timeout else 0)
    assert upstream.connections == (2 if keepalive_timeout else 4)
