"""HTTP/1.1 over a bare socket: for what aiohttp's client will not send (malformed, unfinished or
half-closed requests) and to see exactly what comes back, connection close included."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.server.conftest import ProxyClient


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes  # de-chunked


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.received = b""  # not yet parsed
        self.transcript = b""  # everything received

    async def _read(self) -> bytes:
        chunk = await self.reader.read(65536)
        self.received += chunk
        self.transcript += chunk
        return chunk

    @classmethod
    async def open(cls, proxy: ProxyClient) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def half_close(self) -> None:
        """shutdown(SHUT_WR): the request is all sent; the response direction stays open."""
        self.writer.write_eof()

    async def until_closed(self, seconds: float = 5.0) -> float:
        """Read until the proxy closes the connection; how long that took. Fails on a timeout."""
        started = time.monotonic()
        async with asyncio.timeout(seconds):
            while await self._read():
                pass
        return time.monotonic() - started

    async def still_open_after(self, seconds: float) -> bool:
        """Whether nothing came (no bytes, no close) for `seconds`."""
        try:
            async with asyncio.timeout(seconds):
                await self._read()
        except TimeoutError:
            return True
        return False

    async def response(self, seconds: float = 5.0) -> RawResponse:
        """The next whole response (interim 1xx ones skipped), read without waiting for a close."""
        async with asyncio.timeout(seconds):
            while True:
                parsed = parse_response(self.received)
                if parsed is not None:
                    response, self.received = parsed
                    if response.status >= 200:
                        return response
                    continue
                chunk = await self._read()
                assert chunk, f"connection closed mid-response: {self.received!r}"

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


Connect = Callable[["ProxyClient"], Awaitable[RawConnection]]


@contextlib.asynccontextmanager
async def connections() -> AsyncIterator[Connect]:
    """Open raw connections to a proxy; all are closed at the end."""
    opened: list[RawConnection] = []

    async def connect(proxy: ProxyClient) -> RawConnection:
        opened.append(await RawConnection.open(proxy))
        return opened[-1]

    try:
        yield connect
    finally:
        for connection in opened:
            await connection.close()


def parse_response(raw: bytes) -> tuple[RawResponse, bytes] | None:
    """One response from the front of `raw` and the bytes after it, or None if incomplete."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ")[1])
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if status < 200:
        return RawResponse(status, headers, b""), rest
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line, sep, after = rest.partition(b"\r\n")
            if not sep:
                return None
            size = int(size_line.split(b";")[0], 16)
            if len(after) < size + 2:
                return None
            body, rest = body + after[:size], after[size + 2 :]
            if size == 0:
                return RawResponse(status, headers, body), rest
    length = int(headers.get("content-length", "0"))
    if len(rest) < length:
        return None
    return RawResponse(status, headers, rest[:length]), rest[length:]


def parse(raw: bytes) -> tuple[RawResponse, bytes]:
    """The response at the front of `raw`, which must be whole, and the bytes after it."""
    parsed = parse_response(raw)
    assert parsed is not None, raw
    return parsed


def request(
    method: str, path: str, body: bytes = b"", *, headers: dict[str, str] | None = None
) -> bytes:
    """A request's bytes: a Host, a Content-Length for a body, and `headers`."""
    lines = [f"{method} {path} HTTP/1.1", "Host: proxy"]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
