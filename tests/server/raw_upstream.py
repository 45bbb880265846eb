"""An upstream on a bare socket, for answers no HTTP server library will send: a close right
after reading a request, a head that breaks the rules, a second answer to one request.

Each connection reads requests one after another (a head and its `Content-Length` body) and
writes what `answer` returns for each, as it is (after `delay`, and again `again_after` later
when given); None closes the connection without a word.
`/health` is always a 200, so the proxy's health checks keep every such upstream in rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

# What an upstream does with one request: the bytes it answers with, or None to close.
Answer = Callable[[bytes], bytes | None]
StartUpstream = Callable[..., Awaitable["RawUpstream"]]

HEALTHY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def json_answer(body: bytes = b'{"object": "list", "data": []}') -> bytes:
    """A whole JSON answer that keeps the connection alive."""
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


@dataclass
class RawUpstream:
    answer: Answer
    url: str = ""
    delay: float = 0.0  # seconds before each answer
    # Each answer sent a second time this many seconds after the first (an upstream that
    # answers one request twice), or None.
    again_after: float | None = None
    # The body of every request read whole (health checks aside), in order.
    received: list[bytes] = field(default_factory=list)
    connections: int = 0  # connections the proxy opened for its requests
    _open: set[asyncio.StreamWriter] = field(default_factory=set)

    def count(self, needle: bytes) -> int:
        """How many requests received held `needle` in their body."""
        return sum(needle in body for body in self.received)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        self._open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if head.startswith(b"GET /health "):
                    writer.write(HEALTHY)
                    continue
                if not counted:
                    self.connections += 1
                    counted = True
                self.received.append(body)
                reply = self.answer(body)
                if reply is None:
                    return  # closed unanswered, below
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(reply)
                if self.again_after is not None:
                    asyncio.get_running_loop().call_later(self.again_after, writer.write, reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    def close(self) -> None:
        for writer in list(self._open):
            writer.close()


@contextlib.asynccontextmanager
async def raw_upstreams() -> AsyncIterator[StartUpstream]:
    """Start raw upstreams; every one is stopped, its connections too, at the end."""
    servers: list[tuple[asyncio.Server, RawUpstream]] = []

    async def start(
        answer: Answer, *, delay: float = 0.0, again_after: float | None = None
    ) -> RawUpstream:
        upstream = RawUpstream(answer, delay=delay, again_after=again_after)
        server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
        servers.append((server, upstream))
        upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return upstream

    try:
        yield start
    finally:
        for server, upstream in servers:
            server.close()
            upstream.close()
        for server, _ in servers:
            await server.wait_closed()
