"""The data plane's own upstream connections (proxy/server/data/upstream_protocol.py and
connections.py), against raw servers that say exactly what a test needs them to say."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from proxy.core.errors import ProxyError, UpstreamTimeout
from proxy.core.http.framing import request_head
from proxy.server.data import upstream_protocol
from proxy.server.data.connections import ConnectionPool, Origin
from proxy.server.data.upstream_protocol import (
    MAX_HEAD_BYTES,
    BadResponse,
    ConnectFailed,
    ConnectTimedOut,
    Disconnected,
    ResponseHead,
    UpstreamConnection,
    proxy_error,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    servers: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()

    async def start(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> str:
        async def serving(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
                handlers.discard(task)

        server = await asyncio.start_server(serving, "127.0.0.1", 0, ssl=ssl_context)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.close()
    for task in list(handlers):
        task.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)
    for server in servers:
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def pool(**changes: object) -> ConnectionPool:
    options: dict[str, object] = {
        "limit": 10,
        "limit_per_host": 0,
        "keepalive_timeout": 30.0,
        "connect_timeout": 2.0,
    }
    options.update(changes)
    return ConnectionPool(**options)  # type: ignore[arg-type]


class Body:
    """A sink that keeps what it hears."""

    def __init__(self) -> None:
        self.data = b""
        self.end = asyncio.get_running_loop().create_future()

    def on_data(self, data: bytes) -> None:
        self.data += data

    def on_end(self) -> None:
        self.end.set_result(None)

    def on_error(self, exc: Exception) -> None:
        self.end.set_exception(exc)


async def exchange(
    connections: ConnectionPool, url: str, method: str = "GET", body: bytes | None = None
) -> tuple[UpstreamConnection, ResponseHead, bytes]:
    origin = Origin.of(url)
    conn = await connections.connection(origin)
    head = await conn.request(
        request_head(method, "/x", [("Host", origin.host_header)], body_length=None),
        body,
        head_only=method == "HEAD",
    )
    sink = Body()
    conn.attach(sink)
    await asyncio.wait_for(sink.end, 5)
    connections.release(conn, origin)
    return conn, head, sink.data


async def test_a_connection_is_kept_alive_and_reused(serve) -> None:
    accepted = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    url = await serve(handler)
    connections = pool()
    first, head, data = await exchange(connections, url)
    assert (head.status, data) == (200, b"ok")
    second, _, data = await exchange(connections, url)
    assert data == b"ok"
    assert second is first
    assert accepted == 1
    assert connections.idle_connections == 1
    await connections.close()


async def test_keepalive_timeout_0_and_fresh_connections_reuse_none(serve) -> None:
    accepted = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    url = await serve(handler)
    connections = pool(keepalive_timeout=0.0)
    first, _, _ = await exchange(connections, url)
    second, _, _ = await exchange(connections, url)
    assert second is not first
    assert (accepted, connections.idle_connections) == (2, 0)
    await connections.close()
    # Kept alive, a connection asked to be fresh is a new one whatever is idle.
    connections = pool()
    origin = Origin.of(url)
    kept, _, _ = await exchange(connections, url)
    fresh = await connections.connection(origin, fresh=True)
    assert fresh is not kept
    assert connections.idle_connections == 1
    connections.release(fresh, origin)
    await connections.close()


async def test_a_response_that_closes_is_not_reused(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # HTTP/1.0-style: no length, the body ends with the connection (RFC 9112 §6.3).
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nthe whole body")
        await writer.drain()
        writer.close()

    url = await serve(handler)
    connections = pool()
    first, head, data = await exchange(connections, url)
    assert data == b"the whole body"
    assert not head.keep_alive
    second, _, data = await exchange(connections, url)
    assert second is not first
    assert data == b"the whole body"
    await connections.close()


async def test_interim_answers_are_skipped(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\nX-A: 1\r\n\r\nabc"
        )

    url = await serve(handler)
    connections = pool()
    _, head, data = await exchange(connections, url, "POST", b"{}")
    assert (head.status, head.reason, data) == (201, "Created", b"abc")
    assert head.raw_headers == ((b"Content-Length", b"3"), (b"X-A", b"1"))
    await connections.close()


async def test_a_head_answer_ends_at_its_head(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # A HEAD answer describes the body it does not send.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")

    url = await serve(handler)
    connections = pool()
    conn, head, data = await asyncio.wait_for(exchange(connections, url, "HEAD"), 5)
    assert (head.status, head.content_length, data) == (200, 1000, b"")
    assert not conn.reusable  # what follows cannot be told from a body: never reused
    await connections.close()


async def test_what_one_read_brings_reaches_the_sink_in_one_piece(serve) -> None:
    # Three chunks in one write (a backend faster than the proxy reads): one delivery, so a
    # relay writes once and a Codec body makes one frame of them.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"4\r\nfour\r\n0\r\n\r\n")

    url = await serve(handler)
    connections = pool()
    origin = Origin.of(url)
    conn = await connections.connection(origin)
    await conn.request(
        request_head("GET", "/x", [("Host", origin.host_header)], body_length=None),
        None,
        head_only=False,
    )
    pieces: list[bytes] = []
    ended = asyncio.get_running_loop().create_future()

    class Pieces:
        def on_data(self, data: bytes) -> None:
            pieces.append(data)

        def on_end(self) -> None:
            ended.set_result(None)

        def on_error(self, exc: Exception) -> None:
            ended.set_exception(exc)

    conn.attach(Pieces())
    await asyncio.wait_for(ended, 5)
    assert pieces == [b"onetwothree", b"four"]
    await connections.close()


async def test_a_body_a_server_sends_after_a_head_answer_is_not_part_of_it(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody")  # wrongly, a body

    url = await serve(handler)
    connections = pool()
    conn, head, data = await asyncio.wait_for(exchange(connections, url, "HEAD"), 5)
    assert (head.status, data) == (200, b"")
    assert not conn.reusable
    await connections.close()


async def test_an_oversized_head_is_a_bad_response(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(MAX_HEAD_BYTES // 1000 + 2):
            writer.write(b"X-Pad: " + b"x" * 1000 + b"\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    url = await serve(handler)
    connections = pool()
    with pytest.raises(BadResponse, match="head over"):
        await asyncio.wait_for(exchange(connections, url), 5)
    await connections.close()


async def test_a_malformed_response_is_a_bad_response(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # Both framings at once: the answer to a request-smuggling attempt (RFC 9112 §6.3).
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc"
        )

    url = await serve(handler)
    connections = pool()
    with pytest.raises(BadResponse, match="malformed"):
        await asyncio.wait_for(exchange(connections, url), 5)
    await connections.close()


async def test_a_switch_of_protocols_never_escapes_data_received(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 101 is refused at its head; were it let through, llhttp would stop at the switch with
    # HttpParserUpgrade, which must end the exchange, not leave `data_received` for asyncio to
    # log as a fatal transport error.
    monkeypatch.setattr(upstream_protocol, "status_refusal", lambda status: None)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n"
            b"not http any more"
        )
        await writer.drain()
        await asyncio.sleep(5)

    url = await serve(handler)
    connections = pool()
    with pytest.raises(BadResponse, match="switched protocols"):
        await asyncio.wait_for(exchange(connections, url), 5)
    await connections.close()


async def test_a_closed_idle_connection_is_stale_on_its_next_request(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # Like llama.cpp: reads the next request, then closes without answering.
        await reader.read(65536)
        writer.close()

    url = await serve(handler)
    connections = pool()
    conn, _, _ = await exchange(connections, url)
    reused = await connections.connection(Origin.of(url))
    assert reused is conn
    with pytest.raises(Disconnected) as caught:
        await reused.request(
            request_head("GET", "/x", [("Host", "h")], body_length=None), None, head_only=False
        )
    assert caught.value.stale
    assert caught.value.nothing_received
    await connections.close()


async def test_a_close_after_the_request_on_a_fresh_connection_is_not_stale(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)  # read whole, then dropped: the backend died of it

    url = await serve(handler)
    connections = pool()
    with pytest.raises(Disconnected) as caught:
        await exchange(connections, url)
    # It reached the upstream: not to be sent anywhere else as if it had not.
    assert not caught.value.stale
    assert not caught.value.nothing_sent
    assert caught.value.nothing_received
    await connections.close()


async def test_limits_make_a_request_wait_for_a_connection(serve) -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    url = await serve(handler)
    connections = pool(limit_per_host=1)
    first = asyncio.create_task(exchange(connections, url))
    await asyncio.sleep(0.1)
    second = asyncio.create_task(exchange(connections, url))
    await asyncio.sleep(0.1)
    assert not second.done()
    assert connections.open_connections == 1
    release.set()
    (one, _, a), (two, _, b) = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert a == b == b"ok"
    assert one is two  # the second waited for the first's connection
    await connections.close()


async def test_a_refused_connect_is_connect_failed() -> None:
    connections = pool()
    with pytest.raises(ConnectFailed) as caught:
        await connections.connection(Origin.of("http://127.0.0.1:9"))
    assert caught.value.nothing_received
    await connections.close()


def test_origins() -> None:
    origin = Origin.of("https://user:p%40ss@example.com/prefix/")
    assert (origin.scheme, origin.host, origin.port) == ("https", "example.com", 443)
    assert origin.host_header == "example.com"
    assert origin.base_path == "/prefix"
    assert origin.authorization == "Basic dXNlcjpwQHNz"  # user:p@ss
    assert Origin.of("http://[::1]:8080").host_header == "[::1]:8080"
    with pytest.raises(ValueError, match="URL"):
        Origin.of("ftp://example.com")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for a TLS upstream")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_a_tls_upstream_is_verified_and_served(serve, certificate) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")

    url = await serve(handler, server_context)
    # Not trusted by default: the handshake fails, as a connect failure.
    untrusting = pool()
    with pytest.raises(ConnectFailed):
        await untrusting.connection(Origin.of(url))
    await untrusting.close()
    trusting = ssl.create_default_context(cafile=str(cert))
    connections = pool(ssl_context=trusting)
    _, head, data = await exchange(connections, url)
    assert (head.status, data) == (200, b"secret")
    await connections.close()


def closed(*, before_response: bool) -> Disconnected:
    return Disconnected("closed", before_response=before_response, sent=True, reused=False)


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (ConnectTimedOut("connect timed out"), 504, "connect_timeout"),
        (ConnectFailed("refused"), 502, "unreachable"),
        (closed(before_response=True), 502, "upstream_closed"),
        (closed(before_response=False), 502, "upstream_closed"),
        (BadResponse("malformed response"), 502, None),
        (TimeoutError(), 504, "ttft_timeout"),
        (RuntimeError("anything else"), 502, None),
    ],
)
def test_an_upstream_failure_is_one_error_of_the_proxys(
    failure: BaseException, status: int, code: str | None
) -> None:
    error = proxy_error(failure, "http://backend")
    assert (error.status_hint, error.error_type, error.code) == (
        status,
        "upstream_timeout" if status == 504 else "upstream_error",
        code,
    )
    assert error.__cause__ is failure
    assert error.message.startswith("upstream ")
    assert "(http://backend)" in error.message
    assert str(failure) in error.message


def test_the_proxys_own_error_stays_what_it_is() -> None:
    timeout: ProxyError = UpstreamTimeout("idle", code="idle_timeout")
    assert proxy_error(timeout, "anything") is timeout
