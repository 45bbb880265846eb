"""A fast fake backend for the benchmarks: replays one recorded SSE body, flat out or paced.

    python -m bench.replay_upstream BODY_FILE PORT [INTERVAL_MS]

Every POST gets the recorded body back, one write per SSE event as llama.cpp writes them. With
no interval (the default) it writes flat out: the upstream is never the bottleneck, so the
proxy's CPU cost shows, and a busy proxy reads many events at once. With INTERVAL_MS it sleeps
that long before each token event but the first, like a backend generating tokens, so the
proxy reads them one by one; the final chunk and `[DONE]` follow the last token at once, as
llama.cpp sends them. A request's `X-Replay-Interval-Ms` header (which the proxy forwards) sets
the interval for that request alone. It runs in its own process (started by
bench/throughput.py and bench/load.py) so its CPU time is not the proxy's or the client's. The
response headers are llama.cpp's (chunked `text/event-stream`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

# Per-request pacing, so one upstream serves flat-out and paced streams side by side.
PACE_HEADER = "X-Replay-Interval-Ms"

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
    # Pauses go between tokens only: none before the first, the final chunk or [DONE].
    paced = [index > 0 and b'"finish_reason":null' in event for index, event in enumerate(events)]

    async def replay(request: web.Request) -> web.StreamResponse:
        await request.read()
        pace = request.headers.get(PACE_HEADER)
        pause = float(pace) / 1000 if pace is not None else interval
        response = web.StreamResponse(headers=HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for event, pause_before in zip(events, paced, strict=True):
            if pause and pause_before:
                await asyncio.sleep(pause)
            await response.write(event)
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
        # bench/load.py opens 200 connections at once; the default backlog (128) would drop
        # SYNs and add a 1 s retransmit to some of them.
        backlog=1024,
        print=lambda *_: print(f"listening http://127.0.0.1:{port}", flush=True),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
