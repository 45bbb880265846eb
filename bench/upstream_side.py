"""Which upstream side the callback data plane should use: relay CPU per token, measured.

    .venv/bin/python bench/upstream_side.py                    # 32 streams x 256 tokens, 5 rounds
    .venv/bin/python bench/upstream_side.py --levels 32,200    # also 200 streams
    .venv/bin/python bench/upstream_side.py --quick            # smoke run (about a minute)

The callback data plane moves each upstream body chunk from the upstream's read callback
through a `feed(bytes) -> bytes` transform to the client transport's `write`, with no coroutine
resumed per event. This script measures the upstream sides it could be built on, each as a
minimal relay in a process of its own:

- `A` (aiohttp, callback sink): `aiohttp.ClientSession` sends the request and reads the head;
  then the response's `StreamReader` is switched to a subclass (`__slots__ = ()`, so the
  instance's `__class__` can be assigned) whose `feed_data` hands each body chunk to the sink
  as the C parser delivers it, and whose `feed_eof` lets aiohttp release the connection to its
  pool, then ends the sink. Backpressure pauses the connection's transport (not the
  protocol's `pause_reading`: see `AiohttpUpstream._callback`). Why not a waiter object in
  the reader's `_waiter` whose `set_result` takes the data with `read_nowait()`: that read
  resumes the protocol, which feeds the C parser again from inside its own callback; the inner
  call overwrites the parser's buffer view and every received `bytes` leaks (measured);
- `B` (own HTTP/1.1): an `asyncio.Protocol` with `httptools.HttpResponseParser`; `on_body` calls
  the sink; a keep-alive list of idle connections per relay; backpressure pauses the transport;
- `C` (today's shape, the reference): aiohttp, `await response.content.readany()` in the
  stream's coroutine, each chunk written to the client transport.

Each relay accepts a client connection, reads its request, opens the upstream request, sends a
fixed `HTTP/1.1 200` chunked head, and writes each upstream body chunk through an identity
`feed` as one HTTP/1.1 chunk straight to the transport. Each runs under asyncio's default loop
and under uvloop; nginx (`proxy_buffering off`, bench/paced.py's config) runs beside them.

The upstream is bench/paced_upstream.py (vLLM-shaped SSE, one token per event, 20 ms apart on
a shared step clock). The client is bench/paced.py's: this process, one raw socket per
stream. Per level, the relays and nginx start fresh and are warmed (one request, then one
two-token stream per slot, which fills the pools); then every round measures every relay
once, in a rotated order, with a wave of the level's streams started over `--ramp-ms`.
Measured per wave: relay CPU (utime + stime from /proc/<pid>/stat, and the same from
schedstat in nanoseconds) over the tokens delivered; the CPU other processes used; the load
average. Every response must equal, byte for byte, what the upstream sends for its request
(bench/paced.py's check), so a broken relay cannot look fast; the exit status is 1 if one does
not. Medians over the rounds are reported, and each relay against nginx of the same round.

A separate, untimed wave per relay counts, with a loop subclass, `call_soon` (each task step
is one) and `call_at` per upstream event: C resumes its coroutine once per event, A and B
never. The relays are started by this script as

    python bench/upstream_side.py relay --side A|B|C --loop asyncio|uvloop --port P
        --upstream-port U [--count] [--write-high-water N]

(`--write-high-water` shrinks the client transports' buffer, to exercise backpressure.)

httptools and uvloop are imported only by the relays that use them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp.helpers import _EXC_SENTINEL
from aiohttp.streams import StreamReader

from bench._common import (
    Child,
    Column,
    bench_cache_dir,
    cleanup_on_exit,
    git_commit,
    loadavg,
    machine_info,
    results_path,
    spawn,
    table,
    wait_http_ok,
    write_results,
)

Side = Literal["A", "B", "C"]
LoopKind = Literal["asyncio", "uvloop"]
SIDES: tuple[Side, ...] = ("A", "B", "C")
LOOPS: tuple[LoopKind, ...] = ("asyncio", "uvloop")
SIDE_NAMES = {
    "A": "aiohttp + callback sink",
    "B": "own HTTP/1.1 (httptools)",
    "C": "aiohttp readany (today)",
}
RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\n"
    b"connection: close\r\n"
    b"\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"
# Request headers a relay forwards upstream: the paced upstream's own (pace, record key).
FORWARDED_PREFIX = "x-paced-"


# =============================================================================================
# The relay process
# =============================================================================================


@dataclass
class Stats:
    """What a relay counts; `GET /stats` returns it, with the loop's counters."""

    streams: int = 0
    events: int = 0  # upstream body chunks handed to the sink
    failures: int = 0
    pauses: int = 0  # client transport over its write high-water mark


class Sink(Protocol):
    """Where the upstream side delivers a response body."""

    def data(self, chunk: bytes) -> None: ...
    def end(self) -> None: ...
    def fail(self, exc: BaseException) -> None: ...


class Identity:
    """The transform stage, `feed(bytes) -> bytes`: here it returns its input."""

    __slots__ = ()

    def feed(self, data: bytes) -> bytes:
        return data


class ClientStream:
    """The sink: each body chunk through `feed`, then one HTTP/1.1 chunk on the transport.

    `finished` resolves when the response ended (True) or failed or lost its client (False).
    `pause_upstream`/`resume_upstream` are set by the upstream side; C instead awaits
    `drain()` when `paused`.
    """

    __slots__ = (
        "_drain",
        "closed",
        "feed",
        "finished",
        "pause_upstream",
        "paused",
        "resume_upstream",
        "started",
        "stats",
        "transport",
    )

    def __init__(
        self, transport: asyncio.WriteTransport, stats: Stats, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.transport = transport
        self.stats = stats
        self.feed = Identity().feed
        self.finished: asyncio.Future[bool] = loop.create_future()
        self.paused = False
        self.closed = False
        self.started = False
        self._drain: asyncio.Future[None] | None = None
        self.pause_upstream: Callable[[], None] | None = None
        self.resume_upstream: Callable[[], None] | None = None

    def start(self) -> None:
        self.started = True
        self.transport.write(RESPONSE_HEAD)

    def data(self, chunk: bytes) -> None:
        out = self.feed(chunk)
        if out:
            self.transport.write(b"%x\r\n%b\r\n" % (len(out), out))
        self.stats.events += 1

    def end(self) -> None:
        if self.finished.done():
            return
        self.transport.write(LAST_CHUNK)
        self.transport.close()
        self.finished.set_result(True)

    def fail(self, exc: BaseException) -> None:
        if self.finished.done():
            return
        self.stats.failures += 1
        print(f"stream failed: {exc!r}", file=sys.stderr, flush=True)
        self.transport.abort()  # a truncated chunked body must not look whole
        self.finished.set_result(False)

    # client transport flow control, via ClientConnection
    def pause_writing(self) -> None:
        self.stats.pauses += 1
        self.paused = True
        if self.pause_upstream is not None:
            self.pause_upstream()

    def resume_writing(self) -> None:
        self.paused = False
        if self.resume_upstream is not None:
            self.resume_upstream()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def client_lost(self) -> None:
        self.closed = True
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if not self.finished.done():
            self.finished.set_result(False)

    async def drain(self) -> None:
        if self.paused and not self.closed:
            self._drain = self.finished.get_loop().create_future()
            await self._drain


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def forwarded(self) -> dict[str, str]:
        found = {"content-type": "application/json"}
        for name, value in self.headers:
            if name.startswith(FORWARDED_PREFIX):
                found[name] = value
        return found


class Upstream(Protocol):
    async def relay(self, request: Request, stream: ClientStream) -> None: ...
    async def close(self) -> None: ...


class ClientConnection(asyncio.Protocol):
    """One client connection: one request, then the relayed response, then close."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.buffer = bytearray()
        self.transport: asyncio.WriteTransport | None = None
        self.stream: ClientStream | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's ABCs: no isinstance check.
        self.transport = cast(asyncio.WriteTransport, transport)
        if self.relay.write_high_water is not None:
            self.transport.set_write_buffer_limits(high=self.relay.write_high_water)
            sock = self.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    def data_received(self, data: bytes) -> None:
        if self.task is not None:
            return  # nothing more is read from a client once its request is in
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
        length = int(dict(headers).get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return
        request = Request(method, target, headers, bytes(self.buffer[end + 4 : end + 4 + length]))
        self.task = asyncio.get_running_loop().create_task(self.handle(request))

    async def handle(self, request: Request) -> None:
        assert self.transport is not None
        if request.method == "GET":
            if request.target == "/stats":
                self.reply(200, json.dumps(self.relay.stats()).encode())
            else:
                self.reply(200, b'{"status":"ok"}')
            return
        loop = asyncio.get_running_loop()
        stream = self.stream = ClientStream(self.transport, self.relay.counters, loop)
        self.relay.counters.streams += 1
        try:
            await self.relay.upstream.relay(request, stream)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            if stream.started:
                stream.fail(exc)
            else:
                print(f"upstream failed before the head: {exc!r}", file=sys.stderr, flush=True)
                self.relay.counters.failures += 1
                self.reply(502, b'{"error":"upstream failed"}')

    def reply(self, status: int, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%b" % (status, len(body), body)
        )
        self.transport.close()

    def pause_writing(self) -> None:
        if self.stream is not None:
            self.stream.pause_writing()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.client_lost()


# --- A: aiohttp's connection, body chunks by callback ----------------------------------------

# The sink of each switched reader. A subclass with `__slots__ = ()` adds no storage (that is
# what lets `__class__` be assigned), so the sink is looked up here; removed at the end.
_SINKS: dict[StreamReader, Sink] = {}


class CallbackReader(StreamReader):
    """A response's `StreamReader` after the switch: it buffers nothing.

    aiohttp's C parser (and the Python one) calls `feed_data`, `begin_http_chunk_receiving`,
    `end_http_chunk_receiving`, `feed_eof` and, on a failure, `set_exception` on the payload
    object it created. Here `feed_data` passes the chunk on; chunk boundaries are not kept (the
    split deque would otherwise grow and pause the connection); `feed_eof` runs aiohttp's own
    (it sets `_eof` and runs the eof callbacks: `ClientResponse._response_eof` releases the
    connection to the pool) and then ends the sink.
    """

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        if data:
            self.total_bytes += len(data)
            _SINKS[self].data(data)
        return False

    def end_http_chunk_receiving(self) -> None:
        pass

    def feed_eof(self) -> None:
        super().feed_eof()
        sink = _SINKS.pop(self, None)
        if sink is not None:
            sink.end()

    def set_exception(self, exc: BaseException, exc_cause: BaseException = _EXC_SENTINEL) -> None:
        super().set_exception(exc, exc_cause)
        sink = _SINKS.pop(self, None)
        if sink is not None:
            sink.fail(exc)


def deliver_by_callback(response: aiohttp.ClientResponse, sink: Sink) -> None:
    """From now on, `response`'s body goes to `sink` as the parser delivers it.

    What arrived with the head is read first (from the task, outside the parser: reading can
    resume the parser, which must not be re-entered from one of its own callbacks).
    """
    reader = response.content
    if type(reader) is not StreamReader:  # EMPTY_PAYLOAD, or a decompressing reader
        raise TypeError(f"cannot switch a {type(reader).__name__}")
    while chunk := reader.read_nowait(-1):
        sink.data(chunk)
    if reader.exception() is not None:
        sink.fail(reader.exception() or ConnectionError())
    elif reader.is_eof():
        sink.end()
    else:
        _SINKS[reader] = sink
        reader.__class__ = CallbackReader


class AiohttpUpstream:
    def __init__(self, base: str, callback: bool) -> None:
        self.base = base
        self.callback = callback
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, raise_for_status=False
        )

    async def relay(self, request: Request, stream: ClientStream) -> None:
        url = self.base + request.target
        response = await self.session.post(url, data=request.body, headers=request.forwarded())
        try:
            if response.status != 200:
                raise ValueError(f"upstream status {response.status}")
            stream.start()
            if self.callback:
                await self._callback(response, stream)
            else:
                await self._readany(response, stream)
        finally:
            if not stream.finished.done() or not stream.finished.result():
                response.close()  # not reusable: the body was not read to its end
            response.release()

    async def _callback(self, response: aiohttp.ClientResponse, stream: ClientStream) -> None:
        connection = response.connection
        transport = connection.transport if connection is not None else None
        deliver_by_callback(response, stream)
        reader = response.content
        if transport is not None and not reader.is_eof():
            # Backpressure on the transport, not with the protocol's pause_reading(): that
            # also sets the C parser's `_paused`, which only a body callback clears. Called
            # outside one (the client's buffer filled while the head's data was written), the
            # flag outlives the resume, and the parser then stops after the next body chunk
            # with nobody left to resume it: the stream stalls. Either way the rest of the
            # read in progress is still delivered (B does the same).
            def pause() -> None:
                if not reader.is_eof():  # after the end the connection may serve another
                    transport.pause_reading()

            def resume() -> None:
                if not reader.is_eof():
                    transport.resume_reading()

            stream.pause_upstream, stream.resume_upstream = pause, resume
            if stream.paused:
                pause()
        try:
            await stream.finished
        finally:
            _SINKS.pop(response.content, None)

    async def _readany(self, response: aiohttp.ClientResponse, stream: ClientStream) -> None:
        read = response.content.readany
        while chunk := await read():
            stream.data(chunk)
            if stream.paused:
                await stream.drain()
            if stream.closed:
                return
        stream.end()

    async def close(self) -> None:
        await self.session.close()


# --- B: own HTTP/1.1 connections (httptools) ---------------------------------------------------


class UpstreamConnection(asyncio.Protocol):
    """One upstream HTTP/1.1 connection: one request at a time, the body to a sink."""

    def __init__(self, pool: OwnPool) -> None:
        import httptools

        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[int] | None = None
        self.sink: Sink | None = None
        self.pending: list[bytes] = []  # body that came before the sink was attached
        self.status = 0
        self.complete = False
        self.lost = False

    # requests
    def request(self, data: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.head = asyncio.get_running_loop().create_future()
        self.sink, self.pending, self.status, self.complete = None, [], 0, False
        self.transport.write(data)
        return self.head

    def attach(self, sink: Sink) -> None:
        for chunk in self.pending:
            sink.data(chunk)
        self.pending = []
        if self.complete:
            sink.end()
        else:
            self.sink = sink

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            assert self.transport is not None
            self.transport.abort()
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        if not self.complete:
            self._fail(exc or ConnectionError("upstream closed the connection"))

    # httptools
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:
            return  # 1xx: an interim head (its message completes with no body)
        if self.head is not None and not self.head.done():
            self.head.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is None:
            self.pending.append(body)
        else:
            sink.data(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            return
        self.complete = True
        sink, self.sink = self.sink, None
        keep = self.parser.should_keep_alive()
        if sink is not None:
            sink.end()
        self.pool.release(self, keep)

    def _fail(self, exc: BaseException) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(ConnectionError(f"upstream: {exc!r}"))
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.fail(exc)


class OwnPool:
    """Idle keep-alive connections to one upstream: enough for the benchmark, no more."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[UpstreamConnection] = []

    async def acquire(self) -> UpstreamConnection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.lost:
                return connection
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: UpstreamConnection(self), self.host, self.port
        )
        return protocol

    def release(self, connection: UpstreamConnection, keep_alive: bool) -> None:
        if keep_alive and not connection.lost:
            self.idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()

    def forget(self, connection: UpstreamConnection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(connection)


class HttptoolsUpstream:
    def __init__(self, host: str, port: int) -> None:
        self.pool = OwnPool(host, port)
        self.host_header = f"{host}:{port}"

    async def relay(self, request: Request, stream: ClientStream) -> None:
        head = [f"POST {request.target} HTTP/1.1", f"host: {self.host_header}"]
        head += [f"{name}: {value}" for name, value in request.forwarded().items()]
        head.append(f"content-length: {len(request.body)}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + request.body
        connection = await self.pool.acquire()
        status = await connection.request(data)
        if status != 200:
            raise ValueError(f"upstream status {status}")
        stream.start()
        transport = connection.transport
        assert transport is not None
        stream.pause_upstream, stream.resume_upstream = (
            transport.pause_reading,
            transport.resume_reading,
        )
        connection.attach(stream)
        if not await stream.finished and not connection.complete:
            transport.abort()  # the client left mid-body: the connection cannot be reused

    async def close(self) -> None:
        for connection in self.pool.idle:
            if connection.transport is not None:
                connection.transport.close()


# --- the relay's loop, with optional counters ------------------------------------------------


class Counting(Protocol):
    soon: int
    at: int


def counting_loop_factory(kind: LoopKind) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop class that counts `call_soon` (each task step is one) and `call_at`.

    Under uvloop only calls made through the Python method are seen (task wake-ups from the C
    `Future`/`Task` are; uvloop's own internal scheduling is not).
    """
    base: type[asyncio.AbstractEventLoop]
    if kind == "uvloop":
        import uvloop

        base = uvloop.Loop
    else:
        base = asyncio.SelectorEventLoop

    class CountingLoop(base):  # type: ignore[valid-type,misc]
        soon = 0
        at = 0

        def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:
            self.soon += 1
            return super().call_soon(callback, *args, context=context)

        def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
            self.at += 1
            return super().call_at(when, callback, *args, context=context)

    return CountingLoop


def loop_factory(kind: LoopKind, count: bool) -> Callable[[], asyncio.AbstractEventLoop]:
    if count:
        return counting_loop_factory(kind)
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.SelectorEventLoop


@dataclass
class Relay:
    upstream: Upstream
    counters: Stats = field(default_factory=Stats)
    write_high_water: int | None = None  # tests backpressure: a small client write buffer

    def stats(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return {
            "streams": self.counters.streams,
            "events": self.counters.events,
            "failures": self.counters.failures,
            "pauses": self.counters.pauses,
            "call_soon": getattr(loop, "soon", None),
            "call_at": getattr(loop, "at", None),
            "pid": os.getpid(),
        }


async def serve_relay(args: argparse.Namespace) -> None:
    upstream: Upstream
    if args.side == "B":
        upstream = HttptoolsUpstream("127.0.0.1", args.upstream_port)
    else:
        upstream = AiohttpUpstream(f"http://127.0.0.1:{args.upstream_port}", args.side == "A")
    relay = Relay(upstream, write_high_water=args.write_high_water)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ClientConnection(relay), "127.0.0.1", args.port, backlog=4096
    )
    print(
        f"relay {args.side} ({SIDE_NAMES[args.side]}) on {type(loop).__name__}, "
        f"http://127.0.0.1:{args.port}",
        flush=True,
    )
    try:
        async with server:
            await server.serve_forever()
    finally:
        await upstream.close()


def relay_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="upstream_side.py relay")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--count", action="store_true", help="count call_soon/call_at")
    parser.add_argument(
        "--write-high-water", type=int, help="client transports' write buffer limit (testing)"
    )
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(args.loop, args.count)) as runner:
        runner.run(serve_relay(args))


# =============================================================================================
# The benchmark (client, measurement, report)
# =============================================================================================


@dataclass(frozen=True)
class Contender:
    key: str  # "A/asyncio", ..., "nginx"
    side: Side | None
    loop: LoopKind | None


CONTENDERS = [Contender(f"{s}/{lp}", s, lp) for s in SIDES for lp in LOOPS] + [
    Contender("nginx", None, None)
]


def start_relay(contender: Contender, upstream_port: int, count: bool = False) -> tuple[Child, int]:
    from proxy.embedded import free_port

    assert contender.side is not None
    assert contender.loop is not None
    port = free_port()
    args = [str(Path(__file__).resolve()), "relay", "--side", contender.side]
    args += ["--loop", contender.loop, "--port", str(port), "--upstream-port", str(upstream_port)]
    if count:
        args.append("--count")
    name = f"upstream-side-{contender.side}-{contender.loop}{'-count' if count else ''}"
    child = spawn(name, args, bench_cache_dir() / f"{name}.log")
    wait_http_ok(child, f"http://127.0.0.1:{port}/health", timeout=30)
    return child, port


def relay_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        stats: dict[str, Any] = json.loads(response.read())
    return stats


@dataclass
class Running:
    contender: Contender
    child: Child
    port: int


@dataclass
class Bench:
    args: argparse.Namespace
    texts: list[Any]  # bench.paced_upstream.Text
    upstream: Child
    upstream_port: int
    tag: str


async def measure_wave(
    bench: Bench, running: Running, level: int, tokens: int, key: str
) -> dict[str, Any]:
    """One wave through one relay: its CPU, and every response checked."""
    from bench import paced
    from bench._common import machine_busy_seconds, process_cpu_seconds, self_cpu_seconds

    args = bench.args
    scenario = paced.SCENARIOS["direct"]  # JSON-SSE, identity: the bytes the upstream sends
    port, pid = running.port, running.child.pid
    prefix = f"{bench.tag}/{key}/"
    requests = [
        paced.request_bytes(scenario, port, i, tokens, args.pace_ms, f"{prefix}{i}")
        for i in range(level)
    ]
    timeout = 60 + 3 * tokens * args.pace_ms / 1000 + args.ramp_ms / 1000
    stats_before = relay_stats(port) if running.contender.side is not None else None
    load_before = loadavg()[0]

    def clocks() -> tuple[float, ...]:
        return (
            time.perf_counter(),
            paced.tree_cpu(pid),
            paced.tree_schedstat_cpu(pid),
            process_cpu_seconds(bench.upstream.pid),
            self_cpu_seconds(),
            machine_busy_seconds(),
        )

    before = clocks()
    fetched = await paced.wave(port, requests, args.ramp_ms / 1000, timeout)
    after = clocks()
    stats_after = relay_stats(port) if running.contender.side is not None else None
    wall, relay_cpu, relay_sched, upstream_cpu, client_cpu, busy = (
        b - a for a, b in zip(before, after, strict=True)
    )
    sent = paced.fetch_sent(bench.upstream_port, prefix)
    checked = [
        paced.check(
            scenario,
            bench.texts[f.index % len(bench.texts)],
            f,
            tokens,
            sent.get(f"{prefix}{f.index}"),
        )
        for f in fetched
    ]
    delivered = sum(c.delivered for c in checked)
    failed = [c.problem for c in checked if c.problem is not None]
    delays = sorted(d for c in checked if c.problem is None for d in c.delays)
    result: dict[str, Any] = {
        "contender": running.contender.key,
        "level": level,
        "tokens_per_stream": tokens,
        "streams": len(checked),
        "failed_streams": len(failed),
        "problems": failed[:3],
        "lost_tokens": sum(c.lost for c in checked),
        "tokens_delivered": delivered,
        "wall_seconds": wall,
        "relay_cpu_seconds": relay_cpu,
        "relay_cpu_schedstat_seconds": relay_sched,
        "relay_us_per_token": relay_cpu / delivered * 1e6 if delivered else None,
        "relay_us_per_token_schedstat": relay_sched / delivered * 1e6 if delivered else None,
        "upstream_cpu_seconds": upstream_cpu,
        "client_cpu_seconds": client_cpu,
        "others_cpu_seconds": max(0.0, busy - relay_cpu - upstream_cpu - client_cpu),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": loadavg()[0],
        "client_reads_per_token": sum(c.reads for c in checked) / max(1, delivered),
        "delay_p50_ms": paced.ms(paced.percentile(delays, 50)),
        "delay_p99_ms": paced.ms(paced.percentile(delays, 99)),
    }
    if stats_before is not None and stats_after is not None:
        events = stats_after["events"] - stats_before["events"]
        result["upstream_events"] = events
        result["events_per_token"] = events / delivered if delivered else None
        result["relay_failures"] = stats_after["failures"] - stats_before["failures"]
        for counter in ("call_soon", "call_at"):
            if stats_after[counter] is not None:
                spent = stats_after[counter] - stats_before[counter]
                result[f"{counter}_per_event"] = spent / events if events else None
                result[f"{counter}_per_stream"] = spent / level
    return result


async def warm(bench: Bench, running: Running, level: int) -> list[str]:
    """One request, then one two-token stream per slot at once: the pools fill."""
    from bench import paced

    scenario = paced.SCENARIOS["direct"]
    port = running.port
    first = [paced.request_bytes(scenario, port, 0, 2, 1, None)]
    fetched = await paced.wave(port, first, 0, 60)
    warmup = [paced.request_bytes(scenario, port, i, 2, 100, None) for i in range(level)]
    fetched += await paced.wave(port, warmup, 0, 60)
    return [f.error or f"status {f.status}" for f in fetched if f.error or f.status != 200]


def start_contender(bench: Bench, contender: Contender, level: int) -> Running:
    from bench import paced

    if contender.side is None:
        binary = paced.nginx_binary()
        assert binary is not None
        child, port = paced.start_nginx(binary, bench.upstream_port, level)
    else:
        child, port = start_relay(contender, bench.upstream_port)
    return Running(contender, child, port)


async def run_level(
    bench: Bench, contenders: list[Contender], level: int, rounds: int
) -> tuple[list[dict[str, Any]], list[str]]:
    args = bench.args
    running = [start_contender(bench, c, level) for c in contenders]
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        for r in running:
            problems += [f"{r.contender.key} warm-up: {p}" for p in await warm(bench, r, level)]
        for number in range(rounds):
            # A rotated order per round: no relay always runs first, or right after nginx.
            shift = number % len(running)
            order = running[shift:] + running[:shift]
            print(
                f"  round {number + 1}/{rounds} (load {loadavg()[0]:.2f}): "
                + ", ".join(r.contender.key for r in order),
                flush=True,
            )
            for r in order:
                result = await measure_wave(
                    bench, r, level, args.tokens, f"{level}/{number}/{r.contender.key}"
                )
                result["round"] = number
                results.append(result)
                print(
                    f"    {r.contender.key:<10} {result['streams'] - result['failed_streams']}"
                    f"/{result['streams']} ok, {result['tokens_delivered']:,} tokens, "
                    f"{_fmt(result['relay_us_per_token'])} µs/token "
                    f"(schedstat {_fmt(result['relay_us_per_token_schedstat'])}), "
                    f"others {result['others_cpu_seconds']:.1f} CPU s",
                    flush=True,
                )
                problems += [f"{r.contender.key} round {number}: {p}" for p in result["problems"]]
                if result.get("relay_failures"):
                    problems.append(f"{r.contender.key}: {result['relay_failures']} relay failures")
    finally:
        for r in running:
            r.child.stop()
    return results, problems


async def count_pass(bench: Bench, level: int, tokens: int) -> list[dict[str, Any]]:
    """Untimed: each relay side under a counting loop.

    After the warm-up, a wave of two-token streams, then the measured wave: the difference
    per stream over the difference in events per stream is what one more event costs, without
    what a stream costs once (its connection, task, request and head).
    """
    from bench import paced

    results = []
    for contender in CONTENDERS:
        if contender.side is None:
            continue
        child, port = start_relay(contender, bench.upstream_port, count=True)
        running = Running(contender, child, port)
        try:
            await warm(bench, running, level)
            short_before = relay_stats(port)
            scenario = paced.SCENARIOS["direct"]
            short = [paced.request_bytes(scenario, port, i, 2, 20, None) for i in range(level)]
            await paced.wave(port, short, 0, 60)
            short_after = relay_stats(port)
            result = await measure_wave(bench, running, level, tokens, f"count/{contender.key}")
        finally:
            child.stop()
        short_events = (short_after["events"] - short_before["events"]) / level
        long_events = result["upstream_events"] / level
        for counter in ("call_soon", "call_at"):
            short_spent = (short_after[counter] - short_before[counter]) / level
            result[f"{counter}_per_stream_2_tokens"] = short_spent
            result[f"{counter}_per_extra_event"] = (
                (result[f"{counter}_per_stream"] - short_spent) / (long_events - short_events)
                if long_events > short_events
                else None
            )
        results.append(result)
        print(
            f"  {contender.key:<10} per extra event: call_soon "
            f"{_fmt(result['call_soon_per_extra_event'])}, call_at "
            f"{_fmt(result['call_at_per_extra_event'])}; per stream: call_soon "
            f"{_fmt(result['call_soon_per_stream'])} ({_fmt(short_events)} events: "
            f"{_fmt(result['call_soon_per_stream_2_tokens'])}); events/token "
            f"{_fmt(result.get('events_per_token'))}, {result['failed_streams']} failed",
            flush=True,
        )
    return results


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds, per level and contender; the ratio to nginx is per round."""
    by_round: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        by_round.setdefault((r["level"], r["round"]), {})[r["contender"]] = r
    rows = []
    levels = sorted({r["level"] for r in results})
    keys = [c.key for c in CONTENDERS if any(r["contender"] == c.key for r in results)]
    for level in levels:
        for key in keys:
            mine = [r for r in results if r["level"] == level and r["contender"] == key]
            if not mine:
                continue
            ratios = []
            for r in mine:
                nginx = by_round[(level, r["round"])].get("nginx")
                if nginx is not None and nginx["relay_us_per_token_schedstat"]:
                    ratios.append(
                        r["relay_us_per_token_schedstat"] / nginx["relay_us_per_token_schedstat"]
                    )

            def med(name: str, rows_: list[dict[str, Any]] = mine) -> float | None:
                values = [r[name] for r in rows_ if r.get(name) is not None]
                return statistics.median(values) if values else None

            us = [r["relay_us_per_token"] for r in mine if r["relay_us_per_token"] is not None]
            rows.append(
                {
                    "level": level,
                    "contender": key,
                    "rounds": len(mine),
                    "us_per_token": med("relay_us_per_token"),
                    "us_per_token_schedstat": med("relay_us_per_token_schedstat"),
                    "us_per_token_min": min(us) if us else None,
                    "us_per_token_max": max(us) if us else None,
                    "x_nginx": statistics.median(ratios) if ratios else None,
                    "events_per_token": med("events_per_token"),
                    "delay_p50_ms": med("delay_p50_ms"),
                    "delay_p99_ms": med("delay_p99_ms"),
                    "others_cpu_seconds": med("others_cpu_seconds"),
                    "failed_streams": sum(r["failed_streams"] for r in mine),
                }
            )
    return rows


SUMMARY: list[Column] = [
    ("streams", lambda r: r["level"]),
    ("relay", lambda r: r["contender"]),
    ("upstream side", lambda r: SIDE_NAMES.get(r["contender"].split("/")[0], "nginx")),
    ("rounds", lambda r: r["rounds"]),
    ("µs/token (stat)", lambda r: r["us_per_token"]),
    ("min", lambda r: r["us_per_token_min"]),
    ("max", lambda r: r["us_per_token_max"]),
    ("µs/token (schedstat)", lambda r: r["us_per_token_schedstat"]),
    ("x nginx", lambda r: None if r["x_nginx"] is None else f"{r['x_nginx']:.2f}x"),
    ("events/token", lambda r: r["events_per_token"]),
    ("delay p50 ms", lambda r: r["delay_p50_ms"]),
    ("delay p99 ms", lambda r: r["delay_p99_ms"]),
    ("others CPU s", lambda r: r["others_cpu_seconds"]),
    ("failed", lambda r: r["failed_streams"]),
]
COUNTS: list[Column] = [
    ("relay", lambda c: c["contender"]),
    ("streams", lambda c: c["streams"]),
    ("events", lambda c: c.get("upstream_events")),
    ("events/stream", lambda c: c["upstream_events"] / c["streams"]),
    ("call_soon/stream", lambda c: c.get("call_soon_per_stream")),
    ("call_soon/stream, 2 tokens", lambda c: c.get("call_soon_per_stream_2_tokens")),
    ("call_soon per extra event", lambda c: c.get("call_soon_per_extra_event")),
    ("call_at/stream", lambda c: c.get("call_at_per_stream")),
    ("call_at per extra event", lambda c: c.get("call_at_per_extra_event")),
    ("failed", lambda c: c["failed_streams"]),
]


def report_table(columns: list[Column], rows: list[dict[str, Any]]) -> str:
    return table([name for name, _ in columns], [[get(r) for _, get in columns] for r in rows])


def print_report(rows: list[dict[str, Any]], counts: list[dict[str, Any]]) -> None:
    print(
        "\nRelay CPU per token, median over rounds (µs; stat: utime+stime in clock ticks, "
        "schedstat: ns; x nginx: median of the per-round ratios of the schedstat figures)\n"
        + report_table(SUMMARY, rows)
    )
    if counts:
        print(
            "\nLoop scheduling per upstream event (counting loop, untimed wave)\n"
            + report_table(COUNTS, counts)
        )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench import paced
    from proxy import assets
    from proxy.embedded import free_port
    from proxy.tokenizers import load_tokenizer
    from proxy.tokenizers.vocabulary import Vocabulary

    info = machine_info()
    info["packages"].update({name: _version(name) for name in ("httptools", "uvloop")})
    print(f"machine: {info['nproc']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    gguf = assets.SMOLLM2_GGUF.ensure()
    vocabulary = Vocabulary.build(load_tokenizer(gguf))
    texts = paced.make_texts(vocabulary, args.tokens, min(args.texts, max(args.levels)))
    path = paced.texts_file(texts, args.tokens)
    contenders = [c for c in CONTENDERS if c.key in args.relays]
    if paced.nginx_binary() is None:
        print("nginx is not installed: it is left out")
        contenders = [c for c in contenders if c.side is not None]
    paced.raise_fd_limit(max(args.levels))

    upstream_port = free_port()
    upstream_args = [
        "-m", "bench.paced_upstream", "--streams-file", str(path),
        "--port", str(upstream_port), "--pace-ms", str(args.pace_ms),
    ]  # fmt: skip
    upstream = spawn(
        "paced upstream", upstream_args, bench_cache_dir() / "upstream-side-upstream.log"
    )
    wait_http_ok(upstream, f"http://127.0.0.1:{upstream_port}/health")
    bench = Bench(args, texts, upstream, upstream_port, f"us{os.getpid()}")
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    counts: list[dict[str, Any]] = []
    try:
        if not args.no_count:
            print(f"\ncounting pass: {args.count_streams} streams x {args.tokens} tokens")
            counts = await count_pass(bench, args.count_streams, args.tokens)
            problems += [f"count {c['contender']}: {p}" for c in counts for p in c["problems"]]
        for level, rounds in zip(args.levels, args.rounds, strict=True):
            print(f"\n{level} streams x {args.tokens} tokens, {args.pace_ms:g} ms, {rounds} rounds")
            level_results, level_problems = await run_level(bench, contenders, level, rounds)
            results += level_results
            problems += level_problems
    finally:
        upstream.stop()
    rows = summarize(results)
    print_report(rows, counts)
    duration = time.monotonic() - started
    info["loadavg_at_end"] = loadavg()
    info["commit_at_end"] = git_commit()
    verdict = (
        "CHECKS FAILED:\n  " + "\n  ".join(problems) if problems else "every response verified"
    )
    print("\n" + verdict)
    print(f"duration {duration:.0f} s, load average at end {info['loadavg_at_end']}")
    return {
        "benchmark": "upstream_side",
        "mode": "quick" if args.quick else "full",
        "command": "python bench/upstream_side.py " + " ".join(sys.argv[1:]),
        "duration_seconds": duration,
        "machine": info,
        "settings": {
            "levels": args.levels,
            "rounds": args.rounds,
            "tokens": args.tokens,
            "pace_ms": args.pace_ms,
            "ramp_ms": args.ramp_ms,
            "texts": len(texts),
            "relays": [c.key for c in contenders],
            "sides": SIDE_NAMES,
            "count_pass": None
            if args.no_count
            else {"streams": args.count_streams, "tokens": args.tokens},
        },
        "summary": rows,
        "counts": counts,
        "results": results,
        "failed": problems,
    }


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["relay"]:
        relay_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument(
        "--levels",
        type=lambda s: [int(x) for x in s.split(",")],
        help="concurrent streams, comma-separated (default 32; quick 8)",
    )
    parser.add_argument(
        "--rounds",
        type=lambda s: [int(x) for x in s.split(",")],
        help="rounds per level, one number or one per level (default 5; quick 2)",
    )
    parser.add_argument("--tokens", type=int, help="tokens per stream (default 256; quick 48)")
    parser.add_argument("--pace-ms", type=float, default=20.0, help="between events (20)")
    parser.add_argument("--ramp-ms", type=float, help="streams start over this long (1000)")
    parser.add_argument(
        "--relays",
        type=lambda s: s.split(","),
        default=[c.key for c in CONTENDERS],
        help=f"comma-separated, of {','.join(c.key for c in CONTENDERS)} (default: all)",
    )
    parser.add_argument(
        "--texts",
        type=int,
        default=32,
        help="distinct texts, stream n gets text n mod this (32: the corpus has no 64 clean "
        "256-token cuts at bench/paced.py's spacing)",
    )
    parser.add_argument("--no-count", action="store_true", help="skip the counting pass")
    parser.add_argument("--count-streams", type=int, default=8)
    parser.add_argument("--json", type=Path, help="default bench/results/upstream_side.json")
    args = parser.parse_args(argv)
    unknown = set(args.relays) - {c.key for c in CONTENDERS}
    if unknown:
        parser.error(f"unknown relays {sorted(unknown)}")
    quick = args.quick
    for name, full, short in (("tokens", 256, 48), ("ramp_ms", 1000.0, 200.0)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if args.levels is None:
        args.levels = [8 if quick else 32]
    if args.rounds is None:
        args.rounds = [2 if quick else 5]
    if len(args.rounds) == 1:
        args.rounds = args.rounds * len(args.levels)
    if len(args.rounds) != len(args.levels):
        parser.error("--rounds: one number, or one per level")
    with cleanup_on_exit():
        payload = asyncio.run(run(args))
    write_results(args.json or results_path("upstream_side", quick=quick), payload)
    return 1 if payload["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
