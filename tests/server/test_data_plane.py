"""The data plane relays an event inside the read callback that brought it: no task switches.

The proxy runs on an event loop whose scheduling is counted (`call_soon`: every task step and
future callback goes through it; timers) and how many I/O events it handles. The upstream
and the client are plain sockets in threads, so nothing else runs on that loop: what it counts
while a long stream flows is the proxy's own work per relayed event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.core.guard import StreamGuard
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.otlp_receiver import OtlpReceiver
from tests.server.conftest import AiohttpServer, MakeProxy, ProxyClient
from tests.server.support import post, wait_for

# Each test on the Python path and, when built, the native steady path (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("data_path")

EVENTS = 300
PACE_SECONDS = 0.003  # apart enough that most events are a read of their own


@dataclass
class Counts:
    """What the running loop scheduled (task steps and future callbacks go through
    `call_soon`), the timers it armed, and the I/O events it handled."""

    scheduled: int = 0
    timers: int = 0
    io_events: int = 0


@pytest.fixture
async def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """Counting on the test's own loop (asyncio's selector loop: its methods are looked up on
    the instance, by the C tasks and futures too)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio.SelectorEventLoop)
    counted = Counts()
    call_soon, call_at = loop.call_soon, loop.call_at
    process_events = loop._process_events  # type: ignore[attr-defined]

    def counting_call_soon(*args: Any, **kwargs: Any) -> asyncio.Handle:
        counted.scheduled += 1
        return call_soon(*args, **kwargs)

    def counting_call_at(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        counted.timers += 1
        return call_at(*args, **kwargs)

    def counting_process_events(event_list: list[Any]) -> None:
        counted.io_events += len(event_list)
        process_events(event_list)

    monkeypatch.setattr(loop, "call_soon", counting_call_soon)
    monkeypatch.setattr(loop, "call_at", counting_call_at)
    monkeypatch.setattr(loop, "_process_events", counting_process_events)
    return counted


def event(index: int) -> bytes:
    chunk = {"choices": [{"text": f" word{index % 7}", "index": 0, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


LAST = (
    b'data: {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
)


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return b""
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    return head


@dataclass
class PacedUpstream:
    """A raw HTTP/1.1 upstream in a thread: GETs (health checks) get an empty 200; a POST gets
    a stream of `EVENTS` SSE events, one HTTP chunk each, `PACE_SECONDS` apart."""

    listener: socket.socket = field(default_factory=socket.socket)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.threads.append(threading.Thread(target=self._accept, daemon=True))
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while head := _read_head(conn):
                if head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for index in range(EVENTS):
                    data = event(index)
                    conn.sendall(b"%x\r\n%b\r\n" % (len(data), data))
                    time.sleep(PACE_SECONDS)
                conn.sendall(b"%x\r\n%b\r\n0\r\n\r\n" % (len(LAST), LAST))

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def paced_upstream() -> Iterator[PacedUpstream]:
    upstream = PacedUpstream()
    yield upstream
    upstream.close()


@dataclass
class Window:
    """What the proxy's loop counted between the client's first and last body bytes."""

    scheduled: int
    timers: int
    io_events: int
    body: bytes


def stream_through(
    host: str, port: int, payload: dict[str, Any], loop: Counts, headers: bytes = b""
) -> Callable[[], Window]:
    """A blocking client (run in a thread): send `payload`, read the whole response, and
    take the loop's counts at the first and at the last body byte."""

    def run() -> Window:
        body = json.dumps(payload).encode()
        with socket.create_connection((host, port)) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"%bConnection: close\r\nContent-Length: %d\r\n\r\n%b" % (headers, len(body), body)
            )
            raw = b""
            start: tuple[int, int, int] | None = None
            while piece := sock.recv(65536):
                if start is None and b"\r\n\r\n" in raw + piece:
                    start = (loop.scheduled, loop.timers, loop.io_events)
                raw += piece
            end = (loop.scheduled, loop.timers, loop.io_events)
        assert start is not None
        _, _, chunked = raw.partition(b"\r\n\r\n")
        scheduled, timers, io_events = (b - a for a, b in zip(start, end, strict=True))
        return Window(scheduled, timers, io_events, _dechunk(chunked))

    return run


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return out


@pytest.mark.parametrize(
    "payload",
    [{"prompt": "Hi", "stream": True}, {"prompt": "Hi", "stream_format": "msgpack"}],
    ids=["passthrough", "codec"],
)
async def test_a_relayed_event_resumes_no_coroutine_and_arms_no_timer(
    make_proxy: MakeProxy, paced_upstream: PacedUpstream, payload: dict[str, Any], counts: Counts
) -> None:
    proxy = await make_proxy(upstream=(paced_upstream.url,), health_interval=3600.0)
    assert proxy.port is not None
    window = await asyncio.to_thread(stream_through(proxy.host, proxy.port, payload, counts))
    if "stream_format" in payload:
        frames = FrameDecoder("msgpack").feed(window.body)
        assert sum(f.done for f in frames) == 1
        assert sum(len(f.ids) for f in frames) >= EVENTS
    else:
        assert window.body.count(b"data: ") == EVENTS + 2
    # Most events were a read of their own (a busy machine merges a few): hundreds of I/O
    # events in the window ...
    assert window.io_events >= EVENTS // 2
    # ... and next to none of them resumed a task or scheduled a callback: the few left are
    # the stream's start and end (the handler waking once, the response's last write).
    assert window.scheduled <= 10, window
    assert window.timers <= 5, window


async def test_a_compressed_stream_arms_a_timer_per_flush_window_not_per_event(
    make_proxy: MakeProxy, paced_upstream: PacedUpstream, counts: Counts
) -> None:
    # gzip holds frames for the flush interval: one deadline timer per window of frames (the
    # deadline moves only when a window opens), never one per event.
    proxy = await make_proxy(
        upstream=(paced_upstream.url,), health_interval=3600.0, flush_interval_ms=50.0
    )
    assert proxy.port is not None
    payload = {"prompt": "Hi", "stream_format": "msgpack"}
    headers = b"Accept-Encoding: gzip\r\nCodec-Client-Version: 0.5\r\n"
    window = await asyncio.to_thread(
        stream_through(proxy.host, proxy.port, payload, counts, headers)
    )
    frames = FrameDecoder("msgpack").feed(zlib.decompress(window.body, wbits=31))
    assert sum(f.done for f in frames) == 1
    assert sum(len(f.ids) for f in frames) >= EVENTS
    windows = EVENTS * PACE_SECONDS / 0.050  # about 18 flush windows over the stream
    assert window.timers <= 3 * windows + 5, window
    assert window.timers < EVENTS // 4, window
    assert window.scheduled <= 10, window


async def test_the_counts_see_a_coroutine_per_event(counts: Counts) -> None:
    # The counter is only worth something if it counts task switches: a task woken per item
    # (what an awaited read per event is) shows up as at least one callback per item.
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def consume() -> None:
        for _ in range(EVENTS):
            await queue.get()

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0)
    before = counts.scheduled
    for index in range(EVENTS):
        queue.put_nowait(index)
        await asyncio.sleep(0)
    await consumer
    assert counts.scheduled - before >= EVENTS


async def test_a_bug_in_a_callback_ends_the_stream_with_one_terminal_frame(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # asyncio would log an exception raised in a read callback and drop the connection: the
    # stream instead ends as an upstream failure does, and says which request it was.
    caplog.set_level(logging.INFO)
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), delay=0.01)
    # The guard sees every read's frames, on the Python path (CodecBody.feed) and the native
    # one (the step's text, retokenized) alike.
    guard = StreamGuard._guard
    calls = 0

    def failing_guard(self: StreamGuard, frames: list[Frame]) -> list[Frame]:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("a bug")
        return guard(self, frames)

    monkeypatch.setattr(StreamGuard, "_guard", failing_guard)
    status, _, raw = await post(
        proxy, "/v1/completions", json={"prompt": "Hi", "stream_format": "msgpack"}
    )
    assert status == 200
    frames = FrameDecoder("msgpack").feed(raw)
    assert sum(f.done for f in frames) == 1
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert sum(len(f.ids) for f in frames) > 0  # what was sent before the bug stands
    failed = [r for r in caplog.records if r.getMessage().startswith("stream of request")]
    assert len(failed) == 1
    assert failed[0].levelname == "ERROR"
    access = [r for r in caplog.records if r.name == "codec_proxy.access"]
    assert access[-1].fields["outcome"] == "internal_error"  # type: ignore[attr-defined]
    await wait_for(lambda: upstream.outcomes == ["aborted"])  # and the backend was stopped


async def test_with_traces_on_a_relayed_event_is_still_one_callback(
    make_proxy: MakeProxy,
    paced_upstream: PacedUpstream,
    counts: Counts,
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spans are per request and per upstream attempt (tests/server/test_tracing.py): every
    request sampled, an event costs what it costs without them."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    proxy = await make_proxy(
        upstream=(paced_upstream.url,),
        health_interval=3600.0,
        otlp_traces_endpoint=str(collector.make_url("/v1/traces")),
    )
    assert proxy.port is not None
    payload = {"prompt": "Hi", "stream_format": "msgpack"}
    window = await asyncio.to_thread(stream_through(proxy.host, proxy.port, payload, counts))
    frames = FrameDecoder("msgpack").feed(window.body)
    assert sum(f.done for f in frames) == 1
    assert window.io_events >= EVENTS // 2
    assert window.scheduled <= 10, window
    assert window.timers <= 5, window
    await proxy.close()  # its spans are exported as it stops
    assert {s.kind for s in receiver.spans} == {"server", "client"}
