"""Whether a stream's upstream is read: one small object decides (uvicorn's `FlowControl` and
aiohttp's `BaseProtocol` keep the same state for their own connections).

Two things hold the upstream back, each on its own:

* the client: its transport asked to pause writing (its buffer is over the high-water mark).
  While it does, the write timer runs; a client that takes nothing for `write_timeout` is
  dropped (`on_write_timeout`), since a client that never reads would hold its stream's
  upstream, and the backend's slot, forever;
* the proxy: what arrived while the response was being started is kept for it, and past a
  bound the upstream waits until streaming begins.

The upstream reads again once neither holds it. Nothing here runs per event: only when a
transport crosses its high- or low-water mark, and at a stream's start and end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proxy.server.data.exchange import Exchange


class FlowControl:
    __slots__ = (
        "_exchange",
        "_loop",
        "_on_write_timeout",
        "_timer",
        "_write_timeout",
        "buffering",
        "client_paused",
    )

    def __init__(
        self,
        exchange: Exchange,
        loop: asyncio.AbstractEventLoop,
        *,
        write_timeout: float,
        on_write_timeout: Callable[[], None],
    ) -> None:
        self._exchange = exchange
        self._loop = loop
        self._write_timeout = write_timeout  # seconds; 0: a paused client is never dropped
        self._on_write_timeout = on_write_timeout
        self._timer: asyncio.TimerHandle | None = None
        self.client_paused = False  # the client's transport asked to pause writing
        self.buffering = False  # the proxy holds the upstream until streaming begins

    def pause_client(self) -> None:
        """The client's transport asked to pause writing: the upstream waits, the timer runs."""
        self.client_paused = True
        self._exchange.pause_reading()
        if self._write_timeout and self._timer is None:
            self._timer = self._loop.call_later(self._write_timeout, self._timed_out)

    def resume_client(self) -> None:
        """The client's transport drained: the timer stops, the upstream reads unless held."""
        self.client_paused = False
        self._stop_timer()
        if not self.buffering:
            self._exchange.resume_reading()

    def hold(self) -> None:
        """The proxy keeps enough of what arrived: the upstream waits."""
        if not self.buffering:
            self.buffering = True
            self._exchange.pause_reading()

    def release(self) -> None:
        """What was kept has been fed: the upstream reads unless the client holds it."""
        self.buffering = False
        if not self.client_paused:
            self._exchange.resume_reading()

    def end(self) -> None:
        """The stream is over: no timer, and nothing more read until the control plane drains
        or closes the rest (a response read to its end has nothing more)."""
        self._stop_timer()
        if not self._exchange.complete:
            self._exchange.pause_reading()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._on_write_timeout()
