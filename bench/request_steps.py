"""The steps of one request, timed in place with CPU time (bench/short.py --steps).

    python -m bench.request_steps OUT -- <codec-proxy serve arguments>

Runs `codec-proxy serve` in this process with a CPU-time timer (`time.thread_time_ns()`, the
worker's one thread) around each function of `STEPS`, inclusive of what it calls and, for a
coroutine, of everything the loop ran while it waited. Requests must therefore come one at a
time (bench/short.py sends them from one client): then what the loop runs meanwhile is the
same request's own I/O. SIGUSR1 zeroes the counters (after a warm-up); SIGUSR2 writes them to
OUT as JSON, `{step: [calls, ns]}`, with `process` (the process's CPU time since SIGUSR1).
Each timer costs about a microsecond per call, counted in the step that holds it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (label, "module:attribute" or "module:Class.method"), in the order of a request. Middlewares
# and hooks are replaced where the app factory reads them, before it builds the app.
_CLIENT = "proxy.server.data.client_protocol:ProxyProtocol"
_UPSTREAM = "proxy.server.data.upstream_protocol:UpstreamConnection"
STEPS: tuple[tuple[str, str], ...] = (
    ("accept: connection_made", _CLIENT + ".connection_made"),
    ("request bytes: data_received", _CLIENT + ".data_received"),
    ("request task: _handle_request", "aiohttp.web_protocol:RequestHandler._handle_request"),
    ("  app: Application._handle", "aiohttp.web_app:Application._handle"),
    # Five middlewares, each a coroutine around the rest (before the edge's one middleware)...
    ("    snapshot_middleware", "proxy.server.app:snapshot_middleware"),
    ("    observe_middleware", "proxy.server.app:observe_middleware"),
    ("    error_middleware", "proxy.server.app:error_middleware"),
    ("    expect_middleware", "proxy.server.app:expect_middleware"),
    # ... or their steps as calls (server/control/edge.py).
    ("    take_snapshot", "proxy.server.control.edge:take_snapshot"),
    ("    observe_start", "proxy.server.control.edge:observe_start"),
    ("    expects_continue", "proxy.server.control.edge:expects_continue"),
    ("    observe_end", "proxy.server.control.edge:observe_end"),
    ("      new_record", "proxy.server.control.observe:new_record"),
    ("      access log line", "proxy.server.control.observe:_log"),
    ("    handler: completions", "proxy.server.app:completions"),
    ("      read_body", "proxy.server.control.generation:read_body"),
    ("      codec_plan", "proxy.server.control.generation:codec_plan"),
    ("      serve_codec", "proxy.server.control.generation:serve_codec"),
    ("      relay", "proxy.server.control.generation:relay"),
    ("        relay_response", "proxy.server.control.relay:relay_response"),
    ("        forward_headers", "proxy.server.control.relay:forward_headers"),
    ("        forward_headers", "proxy.server.control.codec:forward_headers"),
    ("        stream_context", "proxy.server.control.relay:stream_context"),
    ("        stream_context", "proxy.server.control.codec:stream_context"),
    ("        the Codec body", "proxy.server.control.codec:_body"),
    ("        upstream: UpstreamPool._send", "proxy.server.data.upstreams:UpstreamPool._send"),
    ("          request head", "proxy.server.data.upstreams:_request_head"),
    ("        stream_response", "proxy.server.control.relay:stream_response"),
    ("        stream_response", "proxy.server.control.codec:stream_response"),
    ("          response.prepare", "aiohttp.web_response:StreamResponse.prepare"),
    ("            echo_request_id", "proxy.server.app:echo_request_id"),
    ("            announce_server_version", "proxy.server.app:announce_server_version"),
    ("            strip_withheld_headers", "proxy.server.app:strip_withheld_headers"),
    ("            response_headers (all four)", "proxy.server.app:response_headers"),
    ("          ResponseStream.run", "proxy.server.data.stream:ResponseStream.run"),
    ("          end_response", "proxy.server.data.stream:ResponseStream.end_response"),
    ("          publish", "proxy.server.data.stream:ResponseStream.publish"),
    ("  finish_response", _CLIENT + ".finish_response"),
    ("upstream reads: data_received", _UPSTREAM + ".data_received"),
    ("  ResponseStream.on_data", "proxy.server.data.stream:ResponseStream.on_data"),
)  # fmt: skip

TOTALS: dict[str, list[int]] = {}


def _timed(label: str, target: Callable[..., Any]) -> Callable[..., Any]:
    totals = TOTALS.setdefault(label, [0, 0])
    clock = time.thread_time_ns
    if inspect.iscoroutinefunction(target):

        @functools.wraps(target)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return await target(*args, **kwargs)
            finally:
                totals[0] += 1
                totals[1] += clock() - started

        return timed_coroutine

    @functools.wraps(target)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return target(*args, **kwargs)
        finally:
            totals[0] += 1
            totals[1] += clock() - started

    return timed


def install() -> None:
    """A timer around each step this tree has (the steps of a tree before or after a change
    differ: a step it does not have shows no calls)."""
    for label, where in STEPS:
        module_name, _, path = where.partition(":")
        *outer, name = path.split(".")
        try:
            owner: Any = importlib.import_module(module_name)
            for part in outer:
                owner = getattr(owner, part)
            original = inspect.getattr_static(owner, name)
        except (ImportError, AttributeError):
            TOTALS.setdefault(label, [0, 0])
            continue
        wrapped = _timed(label, original)
        if getattr(original, "__middleware_version__", None) == 1:
            wrapped.__middleware_version__ = 1  # type: ignore[attr-defined]
        setattr(owner, name, wrapped)


def main() -> None:
    out = Path(sys.argv[1])
    arguments = sys.argv[sys.argv.index("--") + 1 :]
    install()
    started = [time.process_time_ns()]

    def zero(signum: int, frame: object) -> None:
        for totals in TOTALS.values():
            totals[0] = totals[1] = 0
        started[0] = time.process_time_ns()

    def dump(signum: int, frame: object) -> None:
        found = {label: TOTALS[label] for label, _ in STEPS}  # in order, each once
        found["process"] = [1, time.process_time_ns() - started[0]]
        out.write_text(json.dumps(found))

    signal.signal(signal.SIGUSR1, zero)
    signal.signal(signal.SIGUSR2, dump)
    from proxy.cli import main as cli

    sys.exit(cli(["serve", *arguments]))


if __name__ == "__main__":
    main()
