"""The floor under the proxy's cost per request: a bare aiohttp relay (bench/short.py).

    python -m bench.bare_relay --port P --upstream-port U

One aiohttp handler, no middleware, no `on_response_prepare` hook, no access log, no metrics:
it reads the request body, sends it upstream on the proxy's own kept-alive connections
(`proxy.server.data.connections.ConnectionPool`, the same HTTP/1.1 protocol and llhttp parser),
and relays the body the way the proxy's data plane does: the status line and headers with the
first body bytes in one write, then each upstream read as one HTTP/1.1 chunk written straight
to the client's transport from the upstream's read callback. It runs on uvloop, as the proxy
does by default, and keeps client connections alive as aiohttp does.

What the proxy spends per request beyond this relay is its own work (routing, decisions,
records, logs, metrics, hooks); what this relay spends is aiohttp's and the upstream
connection's. The client's end-to-end request headers go upstream (the paced upstream's
`X-Paced-*` among them); the upstream's end-to-end response headers come back.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import cast

from aiohttp import web

from proxy.core.http.framing import request_head
from proxy.core.http.headers import end_to_end
from proxy.server.data.connections import ConnectionPool, Origin

POOL = web.AppKey("pool", ConnectionPool)
ORIGIN = web.AppKey("origin", Origin)
# Set from the request (Host) or the body (Content-Length): never copied.
_OWN_FIELDS = ("host", "content-length")


class Sink:
    """An upstream body: the first read kept for the handler, the rest written as chunks."""

    __slots__ = ("done", "first", "write")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.first: asyncio.Future[bytes] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.write: asyncio.Transport | None = None

    def on_data(self, data: bytes) -> None:
        if not self.first.done():
            self.first.set_result(data)
        elif self.write is not None:
            self.write.write(b"%x\r\n%b\r\n" % (len(data), data))

    def on_end(self) -> None:
        if not self.first.done():
            self.first.set_result(b"")
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, exc: Exception) -> None:
        for future in (self.first, self.done):
            if not future.done():
                future.set_exception(exc)


class HeadsWithFirstBytes(web.StreamResponse):
    """The status line and headers leave with the first body bytes, as the proxy sends them."""

    _send_headers_immediately = False


async def relay(request: web.Request) -> web.StreamResponse:
    app = request.app
    pool, origin = app[POOL], app[ORIGIN]
    body = await request.read()
    fields = [(name.decode(), value.decode()) for name, value in request.raw_headers]
    head = request_head(
        request.method,
        request.raw_path,
        [("Host", origin.host_header), *end_to_end(fields, drop=_OWN_FIELDS)],
        body_length=len(body),
    )
    conn = await pool.connection(origin)
    try:
        answer = await conn.request(head, body, head_only=False)
        sink = Sink(asyncio.get_running_loop())
        conn.attach(sink)
        first = await sink.first
        response = HeadsWithFirstBytes(status=answer.status, reason=answer.reason)
        for name, value in end_to_end(
            [(n.decode(), v.decode()) for n, v in answer.raw_headers], drop=("content-length",)
        ):
            response.headers.add(name, value)
        await response.prepare(request)
        await response.write(first)
        sink.write = cast(asyncio.Transport, request.transport)
        await sink.done
        await response.write_eof()
        return response
    finally:
        conn.detach()
        if not conn.complete:
            conn.close()
        pool.release(conn, origin)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(upstream_port: int) -> web.Application:
    app = web.Application()
    app[POOL] = ConnectionPool(
        limit=4096, limit_per_host=0, keepalive_timeout=60.0, connect_timeout=10.0
    )
    app[ORIGIN] = Origin.of(f"http://127.0.0.1:{upstream_port}")
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", relay)

    async def close_pool(app: web.Application) -> None:
        await app[POOL].close()

    app.on_cleanup.append(close_pool)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvloop

    # SIGTERM (bench/_common.py's Child.stop) ends it; no access log, as the proxy writes its own.
    web.run_app(
        make_app(args.upstream_port),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        backlog=4096,
        loop=uvloop.new_event_loop(),
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
