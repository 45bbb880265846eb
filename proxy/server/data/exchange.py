"""One request to one upstream and its response: the head is in, the body is on its way.

The body reaches whoever `attach`es a `BodySink` (the stream, `stream.py`), by callbacks. The
time-to-first-byte and idle timeouts are one timer per exchange, not a timeout around every
read: it wakes at the deadline, looks at how many body bytes have arrived since it last looked,
and either sleeps again or fails the exchange with `UpstreamTimeout`. While the proxy itself
holds the upstream back (its client is not reading), nothing arriving is not idleness. With a
first-byte deadline, the upstream has answered well only once body bytes came (`answered`,
told once: when the watchdog first sees them, or at the end), not when its head did.

When the exchange ends, its connection goes back to the pool if the response was read to its
end, is drained in the background first when the caller asked for that (`drain_rest`: a Codec
stream whose terminal frame is out, with only the usage chunk and `[DONE]` to come), and is
closed otherwise: closing is what makes the backend stop generating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from multidict import CIMultiDictProxy

from proxy.core.backend.balancer import UpstreamState
from proxy.core.errors import UpstreamTimeout
from proxy.server.data.connections import ConnectionPool, Origin
from proxy.server.data.upstream_protocol import (
    BodySink,
    ResponseHead,
    UpstreamConnection,
    UpstreamConnectionError,
    proxy_error,
)

if TYPE_CHECKING:
    from proxy.core.steady._steady import Step

# After a Codec stream's terminal frame the upstream has its usage chunk and [DONE] left:
# read them, and the connection is reused instead of closed. Past these, a new connection is
# the cheaper loss.
DRAIN_LIMIT_BYTES: Final = 64 * 1024
DRAIN_SECONDS: Final = 0.1


class Exchange:
    __slots__ = (
        "_answered",
        "_conn",
        "_drain",
        "_ended",
        "_loop",
        "_origin",
        "_pool",
        "_seen",
        "_timed_out",
        "_timer",
        "first_byte_deadline",
        "head",
        "idle_timeout",
        "upstream",
    )

    def __init__(
        self,
        pool: ConnectionPool,
        origin: Origin,
        conn: UpstreamConnection,
        head: ResponseHead,
        upstream: UpstreamState,
        *,
        first_byte_deadline: float | None,
        idle_timeout: float | None,
        timed_out: Callable[[str, UpstreamTimeout], None] = lambda kind, exc: None,
        answered: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        # Counts the timeout (`ttft` or `idle`) and tells the balancer, once, as it happens.
        self._timed_out = timed_out
        # Tells the balancer the upstream answered well, once, when its first body bytes are
        # seen (None: nothing to tell, or told).
        self._answered = answered
        self._origin = origin
        self._conn = conn
        self.head = head
        self.upstream = upstream
        self.first_byte_deadline = first_byte_deadline  # loop time by which body bytes must come
        self.idle_timeout = idle_timeout
        self._loop = asyncio.get_running_loop()
        self._seen = 0
        self._drain = False
        self._ended = False
        self._timer: asyncio.TimerHandle | None = None
        self._watch(self._loop.time())

    @property
    def status(self) -> int:
        return self.head.status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.head.headers

    @property
    def bytes_in(self) -> int:
        return self._conn.received

    @property
    def complete(self) -> bool:
        """The upstream's body was read to its end."""
        return self._conn.complete

    def attach(self, sink: BodySink) -> None:
        self._conn.attach(sink)

    @property
    def steady(self) -> Step | None:
        """The native step framing the body, once it took over (upstream_protocol.py)."""
        return self._conn.steady

    def want_native(self) -> None:
        self._conn.want_native()

    def steady_to(self, write: Callable[[Any], object]) -> None:
        self._conn.steady_to(write)

    def detach(self) -> None:
        """Nothing more is delivered to the sink attached."""
        self._conn.detach()

    def pause_reading(self) -> None:
        self._conn.pause_reading()

    def resume_reading(self) -> None:
        self._conn.resume_reading()

    def drain_rest(self) -> None:
        """At the end, read what is left of the body in the background (up to
        `DRAIN_LIMIT_BYTES` within `DRAIN_SECONDS`) so the connection can be reused."""
        self._drain = True

    def cancel(self) -> None:
        """Close the upstream connection now: the backend stops generating."""
        self._stop_watching()
        self._drain = False
        self._conn.close()

    async def read_all(self, limit: int) -> tuple[bytes, bool]:
        """The body, read whole: (the first `limit` bytes, whether that was all of it).

        For small answers the proxy must see whole (an error to relay, a JSON completion to
        check against the safety policy). Raises the proxy's error (`proxy_error`) when the
        upstream fails first, `UpstreamTimeout` when it goes quiet for the idle timeout.
        """
        sink = _Collector(asyncio.get_running_loop().create_future(), limit)
        self.attach(sink)
        try:
            await sink.done
        except UpstreamConnectionError as exc:
            raise proxy_error(exc, "reading the body whole") from exc
        finally:
            self._conn.detach()
        return bytes(sink.data), not sink.over

    def end(self) -> None:
        """The exchange is over: the connection is kept, drained, or closed (see above)."""
        if self._ended:
            return
        self._ended = True
        self._stop_watching()
        conn = self._conn
        if conn.received or conn.complete:
            self._tell_answered()
        conn.detach()
        if conn.complete or conn.closed:
            self._pool.release(conn, self._origin)
        elif self._drain:
            conn.resume_reading()
            _Drainer(self._pool, self._origin, conn)
        else:
            conn.close()
            self._pool.release(conn, self._origin)

    # --- the watchdog ----------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Look again at the first-byte deadline, or one idle timeout from now if sooner:
        idleness is what the watchdog sees between two looks."""
        candidates = [
            when
            for when in (
                self.first_byte_deadline,
                None if self.idle_timeout is None else now + self.idle_timeout,
            )
            if when is not None
        ]
        if candidates:
            self._timer = self._loop.call_at(min(candidates), self._check)

    def _stop_watching(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tell_answered(self) -> None:
        answered, self._answered = self._answered, None
        if answered is not None:
            answered()

    def _check(self) -> None:
        self._timer = None
        conn = self._conn
        if conn.complete or conn.closed:
            return
        now = self._loop.time()
        arrived = conn.received
        if arrived:
            self._tell_answered()
        # Something came since the last look, or the proxy itself holds the upstream back
        # (its client is slow): not idle.
        if arrived != self._seen or conn.reading_paused:
            self._seen = arrived
            self.first_byte_deadline = None
            self._watch(now)
            return
        deadline = self.first_byte_deadline
        if deadline is not None and now < deadline:
            self._watch(now)  # no byte yet, but its deadline has not come
            return
        kind = "ttft" if deadline is not None else "idle"
        timeout = UpstreamTimeout(
            f"upstream sent nothing for too long ({kind} timeout)", code=f"{kind}_timeout"
        )
        self._timed_out(kind, timeout)
        conn.fail(timeout)


class _Collector:
    """A sink that keeps the first `limit` bytes of a body and resolves `done` at its end."""

    __slots__ = ("data", "done", "limit", "over")

    def __init__(self, done: asyncio.Future[None], limit: int) -> None:
        self.done = done
        self.limit = limit
        self.data = bytearray()
        self.over = False

    def on_data(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if len(data) > room:
            self.over = True
            data = data[:room]
        self.data += data

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class _Drainer:
    """Reads the rest of a body nobody needs, then hands the connection back (or closes it)."""

    __slots__ = ("_conn", "_origin", "_pool", "_seen", "_timer")

    def __init__(self, pool: ConnectionPool, origin: Origin, conn: UpstreamConnection) -> None:
        self._pool = pool
        self._origin = origin
        self._conn = conn
        self._seen = 0
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(DRAIN_SECONDS, self._give_up)
        conn.attach(self)

    def on_data(self, data: bytes) -> None:
        self._seen += len(data)
        if self._seen > DRAIN_LIMIT_BYTES:
            self._give_up()

    def on_end(self) -> None:
        self._timer.cancel()
        self._pool.release(self._conn, self._origin)

    def on_error(self, exc: Exception) -> None:
        self._timer.cancel()
        self._pool.release(self._conn, self._origin)

    def _give_up(self) -> None:
        self._timer.cancel()
        self._conn.close()
        self._pool.release(self._conn, self._origin)
