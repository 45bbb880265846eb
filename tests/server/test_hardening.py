"""Production behaviour under faults, in process, with fault-injecting fake upstreams.

Several upstreams and their health, what ejects an upstream (never a request's own error, never
the last one), retries only before the first byte, timeouts and their outcomes, client
disconnects closing the upstream, load shedding, slow clients, API keys, probes, metrics and
access logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame
from proxy.server.control import generation
from proxy.server.data.client_protocol import HALF_CLOSE_GRACE
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import AiohttpServer, MakeProxy, ProxyClient, default_model
from tests.server.policy_support import write_policy
from tests.server.support import wait_for

# What the data plane does with a stream, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

SAMPLE = "llamacpp-completions-sample.txt"


def codec_body(fmt: str = "msgpack") -> dict[str, object]:
    return {"prompt": "Hi", "max_tokens": 32, "stream_format": fmt}


@pytest.fixture
def make_upstream(aiohttp_server: AiohttpServer) -> Callable[[], object]:
    async def make() -> tuple[FakeUpstream, str]:
        fake = FakeUpstream()
        server = await aiohttp_server(fake.app())
        fake.server = server
        return fake, str(server.make_url("")).rstrip("/")

    return make


@pytest.fixture
def closed_port() -> str:
    """A URL nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A URL whose listen queue is full: connections hang until the connect timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield f"http://127.0.0.1:{port}"
    for sock in [server, *fillers]:
        sock.close()


async def frames_of(resp: aiohttp.ClientResponse, fmt: str = "msgpack") -> list[Frame]:
    return FrameDecoder(fmt).feed(await resp.read())  # type: ignore[arg-type]


# --- several upstreams ------------------------------------------------------------------------


async def test_concurrent_streams_are_spread_evenly(make_proxy: MakeProxy, make_upstream) -> None:
    (a, url_a), (b, url_b) = await make_upstream(), await make_upstream()
    for fake in (a, b):
        fake.script = Script(load_capture(SAMPLE), delay=0.01)
    proxy = await make_proxy(upstream=(url_a, url_b))

    async def one() -> None:
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            assert resp.status == 200
            await resp.read()

    await asyncio.gather(*(one() for _ in range(8)))
    assert len(a.requests) == len(b.requests) == 4


async def test_least_outstanding_sends_new_streams_past_a_busy_upstream(
    make_proxy: MakeProxy, make_upstream
) -> None:
    # One stream holds an upstream; the requests after it, one at a time, all go to the other.
    # Round robin would send every other one to the busy upstream.
    (a, url_a), (b, url_b) = await make_upstream(), await make_upstream()
    release = asyncio.Event()
    for fake in (a, b):
        fake.script = Script(load_capture(SAMPLE), stall_after_events=3, stall_until=release)
    proxy = await make_proxy(upstream=(url_a, url_b))

    async def read_one() -> list[Frame]:
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            assert resp.status == 200
            return await frames_of(resp)

    balancer = default_model(proxy).pool.balancer

    def in_flight() -> dict[str, int]:
        return {u.url: u.outstanding for u in balancer.upstreams}

    held = asyncio.ensure_future(read_one())
    try:
        await wait_for(lambda: bool(a.stalled_at or b.stalled_at), seconds=10)
        pairs = [(a, url_a), (b, url_b)]
        if not a.stalled_at:
            pairs.reverse()
        (busy, busy_url), (idle, idle_url) = pairs
        for fake in (a, b):
            fake.script = Script(load_capture(SAMPLE))
        for _ in range(4):
            # One at a time: the last one has let go of its upstream (the proxy reads its end
            # after the client has the whole response).
            await wait_for(lambda: in_flight() == {busy_url: 1, idle_url: 0})
            assert (await read_one())[-1].finish_reason == "length"
        assert (len(busy.requests), len(idle.requests)) == (1, 4)
        assert not held.done()
    finally:
        release.set()
    assert (await held)[-1].finish_reason == "length"  # the held stream ends whole
    # With both idle again, the next two go one to each.
    for _ in range(2):
        await wait_for(lambda: set(in_flight().values()) == {0})
        await read_one()
    assert (len(busy.requests), len(idle.requests)) == (2, 5)


async def test_upstream_down_at_start_is_skipped(
    make_proxy: MakeProxy, make_upstream, closed_port: str
) -> None:
    good, good_url = await make_upstream()
    proxy = await make_proxy(upstream=(closed_port, good_url), health_interval=60)
    for _ in range(4):
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            assert resp.status == 200
            frames = await frames_of(resp)
        assert frames[-1].finish_reason == "length"
    assert len(good.requests) == 4


async def test_upstream_that_dies_is_retried_elsewhere_and_ejected(
    make_proxy: MakeProxy, make_upstream
) -> None:
    doomed, doomed_url = await make_upstream()
    good, good_url = await make_upstream()
    proxy = await make_proxy(upstream=(doomed_url, good_url), eject_after=2, health_interval=60)
    await doomed.server.close()  # refuses connections from now on; health was fine at start
    for _ in range(6):
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            assert resp.status == 200
            frames = await frames_of(resp)
        assert frames[-1].finish_reason == "length"
    assert len(good.requests) == 6  # every request answered once, none lost or doubled
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    # Two refused connects ejected it; after that no request tried it any more.
    assert 'codec_proxy_upstream_errors_total{kind="connect",model="default"} 2.0' in text
    assert "codec_proxy_retries_total 2.0" in text
    assert "codec_proxy_upstream_ejections_total 1.0" in text
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200  # the other one serves


async def test_a_hang_up_before_answering_goes_to_another_upstream_when_asked(
    make_proxy: MakeProxy, make_upstream
) -> None:
    # The upstream read the request: it goes on only with resend_unanswered_requests (without
    # it, a 502: tests/server/test_resends.py).
    flaky, flaky_url = await make_upstream()
    good, good_url = await make_upstream()
    flaky.script = Script(load_capture(SAMPLE), hang_up=True)
    proxy = await make_proxy(
        upstream=(flaky_url, good_url), health_interval=60, resend_unanswered_requests=True
    )
    for _ in range(3):
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            assert resp.status == 200
            await resp.read()
    assert len(good.requests) == 3
    assert flaky.outcomes.count("hung_up") >= 1


async def test_stale_kept_alive_connection_is_retried_on_the_same_upstream(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(SAMPLE), hang_up_on_reused_connection=True)
    for payload in ({"prompt": "Hi", "stream": True}, codec_body(), {"prompt": "Hi"}):
        async with proxy.post("/v1/completions", json=payload) as resp:
            assert resp.status == 200  # never a 502 for a connection the upstream let go
            await resp.read()
    assert upstream.outcomes.count("complete") == 3
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert "codec_proxy_retries_total 2.0" in text  # the 2nd and 3rd found a stale connection
    assert "codec_proxy_upstream_ejections_total 0.0" in text


async def test_failure_after_first_byte_is_never_retried(
    make_proxy: MakeProxy, make_upstream
) -> None:
    (a, url_a), (b, url_b) = await make_upstream(), await make_upstream()
    for fake in (a, b):
        fake.script = Script(load_capture(SAMPLE), drop_after_events=5)
    proxy = await make_proxy(upstream=(url_a, url_b), health_interval=60)
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        frames = await frames_of(resp)
    assert frames[-1].finish_reason == "error"
    assert len(a.requests) + len(b.requests) == 1  # one upstream request, not two


async def test_health_checks_decide_readiness_and_routing(
    make_proxy: MakeProxy, make_upstream
) -> None:
    loading, loading_url = await make_upstream()
    loading.health_code, loading.health_status = 503, "loading model"
    proxy = await make_proxy(upstream=loading_url, health_interval=0.1)
    async with proxy.get("/readyz") as resp:
        assert resp.status == 503
        reasons = (await resp.json())["reasons"]
    assert [(r["check"], r["reason"]) for r in reasons] == [("upstreams", "no_upstream")]
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 503
    assert loading.requests == []
    loading.health_code = 200  # the model finished loading
    await wait_for(lambda: bool(loading.health_checks) and loading.health_code == 200)
    await asyncio.sleep(0.3)
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 200


# --- passive ejection: only what says the upstream is unwell ----------------------------------

# Real llama.cpp answers to requests it cannot serve, whatever its health.
REQUEST_ERRORS = [
    pytest.param(
        "llamacpp-error-tools-500.txt",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "tools": 5},
        id="500-bad-tools",
    ),
    pytest.param(
        "llamacpp-error-embeddings-501.txt", "/v1/embeddings", {"input": "Hi"}, id="501-no-route"
    ),
]


def answer(status: int) -> Capture:
    """A backend's JSON error answer with `status`, in llama.cpp's shape."""
    body = json.dumps({"error": {"code": status, "message": "unwell", "type": "server_error"}})
    headers = (("Content-Type", "application/json; charset=utf-8"),)
    return Capture(status, HTTPStatus(status).phrase, headers, body.encode())


async def metrics_text(proxy: ProxyClient) -> str:
    async with proxy.get("/metrics") as resp:
        return await resp.text()


@pytest.mark.parametrize("upstreams", [1, 2])
@pytest.mark.parametrize(("capture_name", "path", "payload"), REQUEST_ERRORS)
async def test_errors_a_request_caused_never_eject(
    make_proxy: MakeProxy,
    make_upstream,
    upstreams: int,
    capture_name: str,
    path: str,
    payload: dict[str, object],
) -> None:
    capture = load_capture(capture_name)
    fakes = [await make_upstream() for _ in range(upstreams)]
    for fake, _ in fakes:
        fake.script = Script(capture)
    urls = tuple(url for _, url in fakes)
    proxy = await make_proxy(upstream=urls, eject_after=2, health_interval=60)
    for _ in range(8):  # four times eject_after on every upstream
        async with proxy.post(path, json=payload) as resp:
            assert resp.status == capture.status  # the backend's own answer, never our 503
            assert await resp.read() == capture.body
    assert [len(fake.requests) for fake, _ in fakes] == [8 // upstreams] * upstreams
    for fake, _ in fakes:
        fake.script = Script(load_capture(SAMPLE))
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 200
        assert (await frames_of(resp))[-1].finish_reason == "length"
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200
    text = await metrics_text(proxy)
    assert "codec_proxy_upstream_ejections_total 0.0" in text
    assert (
        'codec_proxy_upstream_errors_total{kind="status_5xx",model="default"} 8.0' in text
    )  # still counted


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_failures_eject_one_of_two(
    make_proxy: MakeProxy, make_upstream, status: int
) -> None:
    (sick, sick_url), (good, good_url) = await make_upstream(), await make_upstream()
    sick.script = Script(answer(status))
    proxy = await make_proxy(upstream=(sick_url, good_url), eject_after=2, health_interval=60)
    statuses = []
    for _ in range(8):
        async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
            statuses.append(resp.status)
            await resp.read()
    assert sorted(statuses) == [200] * 6 + [status] * 2  # an answer is final: relayed as is
    assert (len(sick.requests), len(good.requests)) == (2, 6)
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200
    assert "codec_proxy_upstream_ejections_total 1.0" in await metrics_text(proxy)


@pytest.mark.parametrize(
    "stalling",
    [
        Script(load_capture(SAMPLE), header_delay=3.0),
        # The head at once, then nothing: the head's 200 must not clear the count each time.
        Script(load_capture(SAMPLE), stall_after_events=0, stall_seconds=3.0),
    ],
    ids=["no-head", "head-then-nothing"],
)
async def test_timeouts_eject_one_of_two(
    make_proxy: MakeProxy, make_upstream, stalling: Script
) -> None:
    (slow, slow_url), (good, good_url) = await make_upstream(), await make_upstream()
    slow.script = stalling
    proxy = await make_proxy(
        upstream=(slow_url, good_url), eject_after=2, ttft_timeout=0.3, health_interval=60
    )
    statuses = []
    for _ in range(6):
        async with proxy.post("/v1/completions", json=codec_body()) as resp:
            statuses.append(resp.status)
            await resp.read()
    assert sorted(statuses) == [200] * 4 + [504] * 2
    assert (len(slow.requests), len(good.requests)) == (2, 4)
    text = await metrics_text(proxy)
    assert 'codec_proxy_upstream_errors_total{kind="timeout",model="default"} 2.0' in text
    assert "codec_proxy_upstream_ejections_total 1.0" in text


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (Script(answer(503)), 503),
        (Script(load_capture(SAMPLE), header_delay=3.0), 504),
    ],
    ids=["503-answers", "ttft-timeouts"],
)
async def test_the_last_upstream_is_never_ejected(
    make_proxy: MakeProxy, upstream: FakeUpstream, script: Script, expected: int
) -> None:
    upstream.script = script
    proxy = await make_proxy(eject_after=2, ttft_timeout=0.3, health_interval=60)
    for _ in range(5):
        async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
            assert resp.status == expected
            if expected == 503:
                assert (await resp.json())["error"]["message"] == "unwell"  # not our no_upstream
    assert len(upstream.requests) == 5  # every one was tried
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200  # its health check says it is up: only that can say no
    upstream.script = Script(load_capture(SAMPLE))
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 200  # at once, not after eject_seconds
        assert (await frames_of(resp))[-1].finish_reason == "length"
    assert "codec_proxy_upstream_ejections_total 0.0" in await metrics_text(proxy)


# --- timeouts ---------------------------------------------------------------------------------


async def test_connect_timeout_is_504_json(make_proxy: MakeProxy, blackhole: str) -> None:
    proxy = await make_proxy(upstream=blackhole, connect_timeout=0.3, health_interval=60)
    # The start-up health check timed out too; put the upstream back to test a request.
    assert proxy.app is not None
    pool = default_model(proxy).pool
    pool.balancer.checked(pool.balancer.upstreams[0], healthy=True)
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 504
        error = (await resp.json())["error"]
    assert error["code"] == "connect_timeout"
    async with proxy.get("/metrics") as resp:
        assert 'codec_proxy_timeouts_total{kind="connect"} 1.0' in await resp.text()


async def test_upstream_failures_name_no_url_and_no_exception_text(
    make_proxy: MakeProxy, unused_tcp_port: int
) -> None:
    # Nothing listens there: connection refused. /readyz is open without a key, and error
    # bodies go to any client: codes only; the URL and the exception text stay in the log.
    url = f"http://127.0.0.1:{unused_tcp_port}"
    proxy = await make_proxy(upstream=(url,), health_interval=60)
    pool = default_model(proxy).pool
    pool.balancer.checked(pool.balancer.upstreams[0], healthy=True)
    for payload in (codec_body(), {"prompt": "Hi"}):
        async with proxy.post("/v1/completions", json=payload) as resp:
            assert resp.status == 502
            body = await resp.text()
        assert json.loads(body)["error"]["code"] == "unreachable"
        assert str(unused_tcp_port) not in body
        assert "Error" not in body  # no exception class names or reprs
    async with proxy.get("/readyz") as resp:
        report = await resp.text()
    assert str(unused_tcp_port) not in report
    assert "Error" not in report


async def test_an_unexpected_failure_is_a_json_500_without_the_traceback(
    make_proxy: MakeProxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(generation, "codec_plan", broken)
    proxy = await make_proxy()
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 500
        body = await resp.text()
    assert json.loads(body)["error"]["code"] == "internal_error"
    assert "secret" not in body
    assert any("secret internals" in (r.exc_text or "") for r in caplog.records)


async def test_ttft_timeout_before_the_stream_is_504(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(SAMPLE), header_delay=2.0)
    proxy = await make_proxy(ttft_timeout=0.3)
    for payload in (codec_body(), {"prompt": "Hi", "stream": True}):
        async with proxy.post("/v1/completions", json=payload) as resp:
            assert resp.status == 504
            assert (await resp.json())["error"]["code"] == "ttft_timeout"


async def test_a_head_without_a_body_in_time_is_a_ttft_timeout_counted_against_the_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    # The head came at once, the first body byte never did: the same 504 as a head that never
    # came, counted as a ttft timeout, and a failure the balancer hears.
    upstream.script = Script(load_capture(SAMPLE), stall_after_events=0, stall_seconds=3.0)
    proxy = await make_proxy(ttft_timeout=0.3, health_interval=60)
    for payload in (codec_body(), {"prompt": "Hi", "stream": True}):
        async with proxy.post("/v1/completions", json=payload) as resp:
            assert resp.status == 504
            assert (await resp.json())["error"]["code"] == "ttft_timeout"
    (state,) = default_model(proxy).pool.balancer.upstreams
    # A head's 200 is no answer while its body does not come: both timeouts count, in a row
    # (the only upstream is never ejected, so the count shows them).
    assert state.consecutive_failures == 2
    assert "ttft timeout" in (state.last_error or "")
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert 'codec_proxy_timeouts_total{kind="ttft"} 2.0' in text
    # A body that comes clears them.
    upstream.script = Script(load_capture(SAMPLE))
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 200
        assert (await frames_of(resp))[-1].finish_reason == "length"
    assert (state.consecutive_failures, state.last_error) == (0, None)


async def test_idle_timeout_mid_codec_stream_is_a_terminal_error_frame(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(SAMPLE), stall_after_events=6, stall_seconds=3.0)
    proxy = await make_proxy(idle_timeout=0.3)
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 200
        frames = await frames_of(resp)
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert sum(f.done for f in frames) == 1
    await wait_for(lambda: upstream.outcomes == ["aborted"])  # and the upstream was closed


async def test_a_stream_held_up_by_its_client_is_not_idle(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    # The upstream sends as fast as it may; the proxy is the slow side, because its client
    # pauses for several idle timeouts (less than the write timeout). The upstream was never
    # idle, so the body must arrive whole.
    capture = load_capture(SAMPLE)
    event = b"data: " + json.dumps({"choices": [{"text": " x" * 500, "index": 0}]}).encode()
    long_body = (event + b"\n\n") * (24 * 1024) + b"data: [DONE]\n\n"
    upstream.script = Script(capture.__class__(200, "OK", capture.headers, long_body))
    proxy = await make_proxy(idle_timeout=0.3, write_timeout=10)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((proxy.host, proxy.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({"prompt": "Hi", "stream": True}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.sleep(1.5)  # five idle timeouts without reading a byte
    raw = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200")
    assert raw.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # whole, not cut by a timeout
    async with proxy.get("/metrics") as resp:
        assert 'codec_proxy_timeouts_total{kind="idle"}' not in await resp.text()


async def test_idle_timeout_mid_json_stream_closes_the_connection(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(SAMPLE), stall_after_events=6, stall_seconds=3.0)
    proxy = await make_proxy(idle_timeout=0.3)
    async with proxy.post("/v1/completions", json={"prompt": "Hi", "stream": True}) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


# --- client disconnects, slow clients, load shedding -------------------------------------------


@pytest.mark.parametrize(
    ("script", "payload", "phase"),
    [
        (Script(load_capture(SAMPLE), header_delay=5.0), codec_body(), "upstream_headers"),
        (Script(load_capture(SAMPLE), stall_after_events=0, stall_seconds=5.0), codec_body(),
         "first_token"),
        (Script(load_capture(SAMPLE), header_delay=5.0), {"prompt": "Hi"}, "upstream_headers"),
        (Script(load_capture(SAMPLE), stall_after_events=0, stall_seconds=5.0),
         {"prompt": "Hi", "stream": True}, "first_byte"),
    ],
    ids=["codec-before-headers", "codec-before-first-token", "json-non-streaming",
         "json-before-first-byte"],
)  # fmt: skip
async def test_client_disconnect_closes_the_upstream_request(
    make_proxy: MakeProxy, upstream: FakeUpstream, script: Script, payload: object, phase: str
) -> None:
    upstream.script = script
    proxy = await make_proxy()
    request = asyncio.ensure_future(proxy.post("/v1/completions", json=payload))
    await wait_for(lambda: len(upstream.requests) == 1)
    # An EOF right behind the request would be a half-close, answered (test_connections.py).
    await asyncio.sleep(HALF_CLOSE_GRACE)
    request.cancel()  # the client goes away while the upstream is still thinking
    with pytest.raises(asyncio.CancelledError):
        await request
    await wait_for(lambda: upstream.outcomes == ["aborted"], seconds=2.0)
    async with proxy.get("/metrics") as resp:
        assert f'codec_proxy_client_disconnects_total{{phase="{phase}"}} 1.0' in await resp.text()


async def test_client_leaving_after_the_whole_codec_stream_is_no_disconnect(
    proxy: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by bench/load.py: the terminal frame goes out at the finish event, then the proxy
    # reads the upstream's [DONE] to reuse the connection. A client that hangs up as soon as it
    # has the whole response (curl, a one-shot client) cancels that read; the request must
    # still count as a 200, not as a 499 client disconnect.
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    capture = load_capture(SAMPLE)
    upstream.script = Script(capture, stall_after_events=len(capture.events) - 1, stall_seconds=5)
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    body = json.dumps(codec_body()).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    raw = b""
    while not raw.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of a chunked body
        raw += await asyncio.wait_for(reader.read(65536), 5)
    writer.close()  # gone, the moment the response is complete
    await wait_for(lambda: upstream.outcomes == ["aborted"])  # the proxy stopped reading [DONE]
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert (
        'codec_proxy_requests_total{mode="codec",model="default",route="/v1/completions",'
        'status="200"} 1.0' in text
    )
    assert "codec_proxy_client_disconnects_total{" not in text
    fields = [getattr(r, "fields", {}) for r in caplog.records]
    lines = [line for line in fields if line.get("mode") == "codec"]
    assert [(line["status"], line["outcome"]) for line in lines] == [(200, "ok")]
    assert lines[0]["bytes_in"] > 0


@pytest.mark.parametrize(
    ("kind", "payload", "events", "delay"),
    [
        ("passthrough", {"prompt": "Hi", "stream": True}, 64 * 1024, 0.0),
        # Policing reads every character: paced, so the upstream is still sending when the
        # client is dropped (flat out, the whole body would sit in the socket buffers), and
        # long enough (over two minutes at this pace) that a loaded machine cannot let the
        # upstream finish before the proxy drops the client.
        ("policed", {"prompt": "Hi", "stream": True}, 64 * 1024, 0.002),
        ("codec", codec_body(), 16 * 1024, 0.0),
    ],
)
async def test_slow_client_is_dropped_and_its_upstream_closed(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    tmp_path: Path,
    kind: str,
    payload: dict[str, object],
    events: int,
    delay: float,
) -> None:
    # A long stream, and a client that reads the headers and then nothing at all: far more
    # than the socket buffers between us can hold, for each kind of streamed answer.
    capture = load_capture(SAMPLE)
    event = b"data: " + json.dumps({"choices": [{"text": " x" * 500, "index": 0}]}).encode()
    long_body = (event + b"\n\n") * events
    upstream.script = Script(capture.__class__(200, "OK", capture.headers, long_body), delay=delay)
    policy = write_policy(tmp_path) if kind == "policed" else None
    proxy = await make_proxy(write_timeout=0.5, safety_policy=policy)
    # A small receive window, so the proxy's writes back up after a few policed events too.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((proxy.host, proxy.port))
    _reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps(payload).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    # A read transport on either loop (uvloop's are not asyncio.ReadTransport subclasses).
    transport = cast(asyncio.ReadTransport, writer.transport)
    transport.pause_reading()  # stop reading: the proxy's writes back up
    await wait_for(lambda: upstream.outcomes == ["aborted"], seconds=60.0)
    writer.close()
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert 'codec_proxy_timeouts_total{kind="write"} 1.0' in text
    # Dropped by us, not gone by itself: the response stands as sent, marked slow_client.
    assert (
        f'codec_proxy_requests_total{{mode="{kind}",model="default",route="/v1/completions",status="200"}}'
        in (text)
    )
    assert "codec_proxy_client_disconnects_total{" not in text


async def test_beyond_max_streams_is_503_with_retry_after(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(SAMPLE), header_delay=1.0)
    proxy = await make_proxy(max_streams=2)
    first = [
        asyncio.ensure_future(proxy.post("/v1/completions", json=codec_body())) for _ in range(2)
    ]
    await wait_for(lambda: len(upstream.requests) == 2)
    async with proxy.post("/v1/completions", json=codec_body()) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == "overloaded"
    for task in first:
        async with await task as resp:
            assert resp.status == 200
    assert len(upstream.requests) == 2


# --- access, probes, observability ------------------------------------------------------------


async def test_api_keys(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = await make_proxy(api_key=("k-one", "k-two"))
    async with proxy.get("/v1/models") as resp:
        assert resp.status == 401
    async with proxy.get("/v1/models", headers={"Authorization": "Bearer k-wrong"}) as resp:
        assert resp.status == 401
    async with proxy.get("/v1/models", headers={"Authorization": "Bearer k-two"}) as resp:
        assert resp.status == 200
    # The proxy's key is the proxy's business (tests/server/test_api_keys.py).
    assert "Authorization" not in upstream.requests[-1].headers
    for open_path in ("/livez", "/readyz", "/metrics", "/codec/schema"):
        async with proxy.get(open_path) as resp:
            assert resp.status == 200, open_path


async def test_probes_are_answered_locally(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    for path in ("/livez", "/readyz"):
        async with proxy.get(path) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/json")
    assert upstream.requests == []


async def test_metrics_and_access_log(
    proxy: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    headers = {"X-Request-Id": "req-42"}
    async with proxy.post("/v1/completions", json=codec_body("protobuf"), headers=headers) as resp:
        assert resp.headers["X-Request-Id"] == "req-42"
        coding = resp.headers.get("Content-Encoding", "identity")  # the client accepts gzip, br
        await resp.read()
    async with proxy.post("/v1/completions", json={"prompt": "Hi", "stream": True}) as resp:
        generated = resp.headers["X-Request-Id"]
        await resp.read()
    sent = [{k.lower(): v for k, v in r.headers.items()} for r in upstream.requests]
    assert sent[0]["x-request-id"] == "req-42"
    assert sent[1]["x-request-id"] == generated
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    for needle in (
        'codec_proxy_requests_total{mode="codec",model="default",route="/v1/completions",'
        'status="200"} 1.0',
        'codec_proxy_requests_total{mode="passthrough",model="default",route="/v1/completions",'
        'status="200"} 1.0',
        'codec_proxy_tokens_total{format="protobuf",model="default",token_source="retokenized"}',
        f'codec_proxy_client_bytes_total{{encoding="{coding}",mode="codec",model="default"}}',
        'codec_proxy_codec_requests_total{client_version="absent",encoding="'
        + coding
        + '",format="protobuf",model="default"} 1.0',
        'codec_proxy_streams_total{end="complete",mode="codec",model="default"} 1.0',
        'codec_proxy_streams_total{end="complete",mode="passthrough",model="default"} 1.0',
        'codec_proxy_codec_bytes_saved_total{format="protobuf",model="default"}',
        "codec_proxy_time_to_first_token_seconds_bucket",
        "codec_proxy_overhead_seconds_bucket",
    ):
        assert needle in text, needle
    lines = [r.fields for r in caplog.records if hasattr(r, "fields")]
    # Each line has the proxy's own id, and the client's beside it when it sent one.
    codec_line = next(line for line in lines if line["client_request_id"] == "req-42")
    assert re.fullmatch("[0-9a-f]{32}", str(codec_line["id"]))
    json_line = next(line for line in lines if line["id"] == generated)
    assert json_line["client_request_id"] is None
    assert codec_line["mode"] == "codec"
    assert codec_line["stream_format"] == "protobuf"
    assert codec_line["status"] == 200
    assert codec_line["tokens"] > 0
    assert codec_line["ttft"] > 0
    assert codec_line["outcome"] == "ok"
    assert codec_line["model"] == "default"
