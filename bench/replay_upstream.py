"""A fast fake backend for the throughput benchmark: replays one recorded SSE body, flat out.

    python -m bench.replay_upstream BODY_FILE PORT [INTERVAL_MS]

Every POST gets the recorded body back, one write per SSE event as llama.cpp writes them. With
no interval (the default) it writes flat out: the upstream is never the bottleneck, so the
proxy's CPU cost shows, and a busy proxy reads many events at once. With INTERVAL_MS it sleeps
that long after each event, like a backend generating tokens, so the proxy reads them one by
one. It runs in its own process (started by bench/throughput.py) so its CPU time is not the
proxy's or the client's. The response headers are llama.cpp's (chunked `text/event-stream`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

HEADERS = {
    "Server": "llama.cpp",
    "Access-Control-Allow-Origin": "",
    "X-Accel-Buffering": "no",
    "Content-Type": "text/event-stream",
}


def split_events(body: bytes) -> list[bytes]:
    """The body cut after each blank line, so the pieces concatenate back to the body."""
    events = []
    start = 0
    while (end := body.find(b"\n\n", start)) >= 0:
        events.append(body[start : end + 2])
        start = end + 2
    if start < len(body):
        events.append(body[start:])
    return events


def make_app(body: bytes, interval: float = 0.0) -> web.Application:
    events = split_events(body)
    assert b"".join(events) == body

    async def replay(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers=HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for event in events:
            await response.write(event)
            if interval:
                await asyncio.sleep(interval)
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/{tail:.*}", replay)
    return app


def main(argv: list[str]) -> None:
    body = Path(argv[0]).read_bytes()
    port = int(argv[1])
    interval = float(argv[2]) / 1000 if len(argv) > 2 else 0.0
    web.run_app(
        make_app(body, interval),
        host="127.0.0.1",
        port=port,
        access_log=None,
        print=lambda *_: print(f"listening http://127.0.0.1:{port}", flush=True),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
