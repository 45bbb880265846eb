"""Run one worker: listen, serve until SIGTERM or SIGINT, drain, exit; SIGHUP reloads.

Not `web.run_app`: its shutdown stops listening and then waits on handlers without a way to
end a stream with its terminal frame. Here the order is the one a rolling deploy needs:
not-ready at once, stop accepting, let streams finish for `drain_timeout`, end the rest
cleanly, close. An admin listener (`admin_port`) keeps answering probes until the very end.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from proxy import hangups
from proxy.core.backend.readiness import Check
from proxy.core.errors import ConfigError
from proxy.server.control.admin import ADMIN_APP
from proxy.server.control.errors import connection_error
from proxy.server.data.client_protocol import ProxyServer
from proxy.server.data.drain import LIFECYCLE, READINESS
from proxy.server.models.live import LIVE
from proxy.server.process.reload import schedule_reload
from proxy.server.telemetry.metrics import METRICS
from proxy.settings import Settings

log = logging.getLogger("codec_proxy")

# After the drain, how long aiohttp may take closing what is left. With lifecycle.CANCEL_GRACE
# this is what a process may need beyond `drain_timeout` after SIGTERM (deploy/ sizes
# terminationGracePeriodSeconds with it).
SHUTDOWN_GRACE = 5.0


class ProxyRunner(web.AppRunner):
    """`AppRunner` whose server makes `ProxyProtocol` connections, for the app's settings."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # the app started, its arguments merged
        return ProxyServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            head_timeout=self.app[LIVE].current.settings.request_timeout,
            on_head_timeout=self.app[METRICS].timeouts.labels("request_head").inc,
            render_error=connection_error,
            **server._kwargs,
        )


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a worker runs on (`event_loop`): uvloop by default where it is installed,
    since it relays a token for less CPU (docs/BENCHMARKS.md); asyncio's own otherwise. None:
    asyncio's default."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise ConfigError(
                "event_loop = uvloop, but uvloop is not installed (pip install uvloop)"
            ) from exc
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, None], settings: Settings) -> None:
    """Run a worker's `main` on the loop `settings` choose."""
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        runner.run(main)


async def serve(
    app: web.Application,
    settings: Settings,
    *,
    reuse_port: bool = False,
    announce: Callable[[], None] = lambda: None,
) -> None:
    runner = _runner(app)
    await runner.setup()
    # Everything built at start (vocabularies, maps, tables: tens of thousands of objects that
    # live as long as the process) leaves the collector's reach: a full collection then scans
    # only what requests made, instead of pausing every stream for tens of milliseconds.
    gc.freeze()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port, backlog=1024)
    await site.start()
    # The admin listener (server/control/admin.py) once the serving port listens, so a probe
    # it answers never reports ready before requests can arrive; closed last, below.
    admin = _runner(app[ADMIN_APP]) if ADMIN_APP in app else None
    if admin is not None:
        await admin.setup()
        await web.TCPSite(admin, settings.host, settings.admin_port, reuse_port=reuse_port).start()
    announce()

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    forced = asyncio.Event()

    def on_signal() -> None:
        # The first signal drains; a second one (an impatient Ctrl-C) ends streams now.
        (forced if stop.is_set() else stop).set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    # The reload runs as a task (proxy/server/process/reload.py): the loop keeps serving meanwhile.
    loop.add_signal_handler(signal.SIGHUP, schedule_reload, app)
    if hangups.take():  # one came while the process was starting
        schedule_reload(app)
    try:
        await stop.wait()
        lifecycle = app[LIFECYCLE]
        lifecycle.draining = True
        app[READINESS].update(  # /readyz answers 503 from now on
            Check("draining", ready=False, reason="draining", detail="shutting down")
        )
        await site.stop()  # no new connections
        if runner.server is not None:
            runner.server.pre_shutdown()  # no new requests on kept-alive connections
        log.info(
            "draining: %d stream(s) in flight, up to %.0fs",
            len(lifecycle.streams),
            settings.drain_timeout,
        )
        drain = asyncio.ensure_future(lifecycle.drain(settings.drain_timeout))
        waiter = asyncio.ensure_future(forced.wait())
        await asyncio.wait({drain, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
            await lifecycle.drain(0.0)
        waiter.cancel()
        ended = len(lifecycle.streams)
        if ended:
            log.warning("drain: %d stream(s) still open at exit", ended)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        # Removing the handler restored SIGHUP's default action, which would end the process
        # while it closes; a reload now has nothing left to apply to.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        await runner.cleanup()
        if admin is not None:
            await admin.cleanup()


def _runner(app: web.Application) -> ProxyRunner:
    return ProxyRunner(  # on the proxy's own connections (proxy/server/data/client_protocol.py)
        app,
        handle_signals=False,
        # A client that disconnects cancels its handler at once, which closes the upstream
        # request, so the backend stops generating (peers.md A7).
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE,
    )
