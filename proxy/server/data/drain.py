"""The graceful drain: which streams are in flight, and how to end them.

On SIGTERM the proxy turns not-ready at once, stops accepting connections, lets in-flight
streams finish for up to `drain_timeout` seconds, then ends the rest: a Codec stream gets its
terminal error frame, a JSON stream its connection closed. Then the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web

from proxy.core.backend.readiness import Readiness

# The message a stream's task is cancelled with when the drain timeout ran out: the stream
# tells this apart from a client that left, and ends with a terminal frame instead.
SHUTDOWN = "codec-proxy: drain timeout reached, ending the stream"
# How long streams cut at the drain timeout get to write their terminal frame.
CANCEL_GRACE = 5.0


@dataclass
class Lifecycle:
    draining: bool = False
    streams: set[asyncio.Task[object]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Count the current task as an in-flight stream for the drain."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - handlers always run in a task
            yield
            return
        self.streams.add(task)
        try:
            yield
        finally:
            self.streams.discard(task)

    async def drain(self, seconds: float) -> int:
        """Wait for in-flight streams; end those still running after `seconds`; count those."""
        self.draining = True
        if self.streams and seconds > 0:
            await asyncio.wait(list(self.streams), timeout=seconds)
        left = list(self.streams)
        for task in left:
            task.cancel(SHUTDOWN)
        if left:
            await asyncio.wait(left, timeout=CANCEL_GRACE)
        return len(left)


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
# The process's own readiness (draining); each model keeps its own beside it.
READINESS = web.AppKey("readiness", Readiness)


def is_shutdown(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.CancelledError) and SHUTDOWN in exc.args
