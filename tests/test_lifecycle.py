"""The proxy as a process: SIGTERM drains, --workers shares a port and its metrics, and a client
that leaves makes the real llama.cpp server stop generating at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy import assets
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame
from proxy.embedded import free_port
from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import BACKEND_METRICS, FakeUpstream, Script, load_capture
from tests.llama_slots import busy_slots, generation_seconds, idle_long_before_done, wait_idle
from tests.process_support import (
    ServeProcess,
    children,
    listening_ports,
    serving_worker,
    workers_listen,
)
from tests.server.conftest import AiohttpClient, AiohttpServer, ProxyClient
from tests.server.raw_http import RawConnection, request

SAMPLE = "llamacpp-completions-sample.txt"
COMPLETION = request(
    "POST", "/v1/completions", b'{"prompt": "x"}', headers={"Content-Type": "application/json"}
)


class ProxyProcess(ServeProcess):
    def __init__(self, upstream: str, tokenizer: Path, *extra: str) -> None:
        # The fake upstream replays completions on every path, /tokenize too: no drift check.
        super().__init__("--upstream", upstream, "--tokenizer", str(tokenizer),
                         "--drift-check", "off", *extra)  # fmt: skip


@pytest.fixture
async def slow_upstream(aiohttp_server: AiohttpServer) -> tuple[FakeUpstream, str]:
    fake = FakeUpstream()
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("")).rstrip("/")


StartProxy = Callable[..., ProxyProcess]


@pytest.fixture
def proxy_process(smollm2_gguf: Path) -> Iterator[StartProxy]:
    """Start `codec-proxy serve` processes; they are killed at the end of the test."""
    started: list[ProxyProcess] = []

    def start(upstream: str, *extra: str) -> ProxyProcess:
        started.append(ProxyProcess(upstream, smollm2_gguf, *extra))
        return started[-1]

    yield start
    for process in started:
        process.stop()


async def stream_frames(url: str, body: dict[str, object]) -> AsyncIterator[Frame]:
    decoder = FrameDecoder("msgpack")
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_any():
                for frame in decoder.feed(chunk):
                    yield frame


async def test_sigterm_lets_in_flight_streams_finish_then_exits_0(
    slow_upstream: tuple[FakeUpstream, str], proxy_process: StartProxy
) -> None:
    fake, url = slow_upstream
    fake.script = Script(load_capture(SAMPLE), delay=0.03)  # about 2 s of streaming
    proxy = proxy_process(url, "--drain-timeout", "20")
    await asyncio.to_thread(proxy.wait_ready)
    frames: list[Frame] = []
    async for frame in stream_frames(proxy.url, {"prompt": "x", "stream_format": "msgpack"}):
        if not frames:
            proxy.proc.send_signal(signal.SIGTERM)  # mid-stream
            await asyncio.sleep(0.3)
            # Not accepting any more.
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as session:
                    await session.get(proxy.url + "/livez")
        frames.append(frame)
    assert frames[-1].done
    assert frames[-1].finish_reason == "length"  # finished normally, not cut
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0


async def test_drain_timeout_ends_the_rest_with_a_terminal_frame(
    slow_upstream: tuple[FakeUpstream, str], proxy_process: StartProxy
) -> None:
    fake, url = slow_upstream
    fake.script = Script(load_capture(SAMPLE), delay=0.5)  # far longer than the drain timeout
    proxy = proxy_process(url, "--drain-timeout", "1")
    await asyncio.to_thread(proxy.wait_ready)
    frames: list[Frame] = []
    signalled = 0.0
    async for frame in stream_frames(proxy.url, {"prompt": "x", "stream_format": "msgpack"}):
        if not frames:
            proxy.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
        frames.append(frame)
    took = time.monotonic() - signalled
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert sum(f.done for f in frames) == 1
    assert 0.8 < took < 6.0
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0


async def test_two_workers_share_the_port_and_their_metrics(
    slow_upstream: tuple[FakeUpstream, str], proxy_process: StartProxy
) -> None:
    """Both workers serve (each connection is found in the worker that holds it), and either
    one's /metrics counts every request."""
    _, url = slow_upstream
    proxy = proxy_process(url, "--workers", "2")
    await asyncio.to_thread(proxy.wait_ready)
    await asyncio.to_thread(workers_listen, proxy, 2)
    # Which worker served each request: requests until both have (at least 30 in all).
    served_by: Counter[int] = Counter()
    requests = 0
    while requests < 30 or len(served_by) < 2:
        assert requests < 200, f"one worker served every request: {served_by}"
        # A new connection each time, so the kernel spreads them over both workers.
        connection = RawConnection(*await asyncio.open_connection("127.0.0.1", proxy.port))
        try:
            await connection.send(COMPLETION)
            assert (await connection.response(30)).status == 200
            # Kept alive: the worker that answered still holds the connection.
            client_port = connection.writer.get_extra_info("sockname")[1]
            served_by[serving_worker(proxy, client_port)] += 1
        finally:
            await connection.close()
        requests += 1
    totals = set()
    for _ in range(6):
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.url + "/metrics") as resp:
                status, text = resp.status, await resp.text()
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("codec_proxy_requests_total{") and 'route="/v1/completions"' in line
        )
        # Whichever worker answers, it reports both workers' requests.
        assert (status, total) == (200, float(requests)), text[:2000]
        totals.add(total)
    assert totals == {float(requests)}
    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    out = proxy.stop()
    assert out.count("worker") >= 1  # the supervisor announced its workers
    # Every worker logs, worker 0 included (a spawned process starts without logging set up).
    access = [line for line in out.splitlines() if "codec_proxy.access" in line]
    assert sum("route=/v1/completions" in line for line in access) == requests


# --- an admin port (endpoint pickers scrape the serving port) ----------------------------------


async def get(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:  # a new connection: any worker may answer
        async with session.get(url) as resp:
            return resp.status, await resp.read()


async def get_retried(url: str) -> int:
    """A GET's status, retried while a worker that drained closes its socket under it."""
    for _ in range(20):
        try:
            return (await get(url))[0]
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


def completions_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("codec_proxy_requests_total{") and 'route="/v1/completions"' in line
    )


async def test_two_workers_with_an_admin_port(
    slow_upstream: tuple[FakeUpstream, str], proxy_process: StartProxy
) -> None:
    fake, url = slow_upstream
    fake.paths["/metrics"] = BACKEND_METRICS
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    proxy = proxy_process(url, "--workers", "2", "--admin-port", str(admin_port))
    await asyncio.to_thread(proxy.wait_ready, admin)
    # Every worker listens on both ports (SO_REUSEPORT), the supervisor on none.
    deadline = time.monotonic() + 30
    while True:
        listening = [listening_ports(pid) for pid in children(proxy.proc.pid)]
        if sorted(map(sorted, listening)).count(sorted({proxy.port, admin_port})) == 2:
            break
        assert time.monotonic() < deadline, listening
        await asyncio.sleep(0.1)
    assert listening_ports(proxy.proc.pid) == set()

    requests = 16
    for _ in range(requests):
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.url + "/v1/completions", json={"prompt": "x"}) as resp:
                assert resp.status == 200
                await resp.read()
    for _ in range(6):
        # The serving port: the backend's metrics, byte for byte, whichever worker relays.
        assert await get(proxy.url + "/metrics") == (200, BACKEND_METRICS.body)
        # The admin port: the proxy's own, every worker's requests in each answer.
        status, own = await get(admin + "/metrics")
        assert (status, completions_total(own.decode())) == (200, float(requests))
    assert await get_retried(admin + "/livez") == 200
    relayed = [r.path_qs for r in fake.requests if r.method == "GET"]
    assert relayed == ["/metrics"] * 6

    # SIGTERM mid-stream: the serving port stops accepting, the admin port still answers probes
    # (not ready) until the last worker has drained and exits.
    fake.script = Script(load_capture(SAMPLE), delay=0.03)  # about 2 s of streaming
    frames: list[Frame] = []
    async for frame in stream_frames(proxy.url, {"prompt": "x", "stream_format": "msgpack"}):
        if not frames:
            proxy.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientConnectionError):
                await get(proxy.url + "/readyz")
            assert await get_retried(admin + "/readyz") == 503
            assert await get_retried(admin + "/livez") == 200
        frames.append(frame)
    assert frames[-1].finish_reason == "length"
    assert await asyncio.to_thread(proxy.proc.wait, 30) == 0
    out = proxy.stop()
    assert f"2 workers on port {proxy.port} (admin port {admin_port})" in out
    assert f"/livez, /readyz, /metrics on http://127.0.0.1:{admin_port}" in out


# --- the real backend: a client that leaves frees the llama.cpp slot ---------------------------


@pytest.fixture
async def real_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=smollm2_vocabulary.loaded.source
    )
    # Served on the proxy's own connections, which tell a half-close from a client that left.
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


# More than a slot's context holds (1024): the request could run until the context is full.
MAX_TOKENS = 4000
LONG = {"max_tokens": MAX_TOKENS, "temperature": 0.8, "ignore_eos": True, "cache_prompt": False}


# llama.cpp notices a closed connection when it next writes to it: at the next token of a
# streamed answer. It cannot notice during a prefill or while it computes a non-streamed answer
# (measured without the proxy: a raw socket closed mid-prefill or mid non-streamed answer leaves
# the slot busy until the work is done, SSE pings or not). The proxy closes its upstream
# connection at once in every phase (tests/server/test_hardening.py); this shows the backend
# then stops mid-stream, long before the rest of the request could have been generated
# (tests/llama_slots.py measures how long that would be).
@pytest.mark.backend
@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Tell a story.", "stream_format": "msgpack", **LONG},
        {"prompt": "Tell a story.", "stream": True, **LONG},
    ],
    ids=["codec-mid-stream", "json-mid-stream"],
)
async def test_client_disconnect_frees_the_llamacpp_slot(
    real_proxy: ProxyClient,
    llama_server: str,
    body: dict[str, object],
    request: pytest.FixtureRequest,
) -> None:
    await wait_idle(llama_server, 30.0)  # nothing left over from earlier tests
    full = await generation_seconds(llama_server, MAX_TOKENS)
    streaming = asyncio.Event()

    async def client() -> None:
        async with real_proxy.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readany()
            streaming.set()
            await asyncio.sleep(60)  # until it leaves

    began = time.monotonic()
    task = asyncio.ensure_future(client())
    await asyncio.wait_for(streaming.wait(), 30)  # its first bytes are in: mid-stream
    assert await busy_slots(llama_server) == 1
    task.cancel()  # the client leaves
    left = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    await idle_long_before_done(llama_server, full, began)
    took = time.monotonic() - left
    report = assets.cache_dir() / "reports" / "disconnect-slot-idle.json"
    report.parent.mkdir(exist_ok=True)
    figures = json.loads(report.read_text()) if report.exists() else {}
    figures[request.node.callspec.id] = round(took, 3)
    report.write_text(json.dumps(figures, indent=2))
