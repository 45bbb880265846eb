"""The upstream side: a pool of backends, one pooled `ClientSession` per worker, timeouts.

- Each request goes to the routable upstream with the fewest requests in flight
  (`proxy/core/backend/balancer.py`); active health checks and passive ejection decide which are
  routable. Only connect failures, timeouts and 502/503/504 count towards ejection, never a 500,
  501 or 4xx (one request's problem), and the last upstream in rotation is never ejected.
- A request is retried on another upstream only when the connection failed before the upstream
  sent a single byte (refused, reset, a stale pooled connection): nothing can have reached the
  client yet, so nothing is ever duplicated. An upstream's answer, even a 5xx, is final.
- Timeouts: connect; time to first byte (headers and first body chunk share one budget); idle
  between chunks. No total timeout: a long generation is not a failure (peers.md A2).
- More than a model's share of `max_streams` in flight for that model, or more than
  `max_streams` for every model together, is shed with 503 + Retry-After before any work.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.core.backend.balancer import Balancer, UpstreamState
from proxy.core.backend.readiness import Check, Readiness
from proxy.core.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.telemetry.metrics import Metrics
from proxy.settings import UNNAMED_MODEL, Settings

log = logging.getLogger("codec_proxy")

# aiohttp's client adds these when a request lacks them; a transparent proxy must not.
SKIP_AUTO_HEADERS = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})

# aiohttp hands a bytes body to the transport in one write, and warns (ResourceWarning) above
# 1 MiB that this holds the loop; a BytesIO goes out in 64 KiB writes with the loop turning in
# between. Long token-ID prompts and relayed uploads are such bodies.
_ONE_WRITE_BYTES = 1 << 20

# Our own probes say who they are, so backend logs (and tests) can tell them from traffic.
HEALTH_CHECK_HEADERS = {"User-Agent": "codec-proxy-health-check"}

# A pooled keep-alive connection the upstream had already closed (llama.cpp half-closes after a
# streamed response; uvicorn closes idle ones after 5 s): the request never started there, so
# it is sent again at once, to the same upstream, on a fresh connection.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)

# The connection failed before the upstream answered anything: safe to try another upstream.
_NOTHING_SENT = (
    aiohttp.ConnectionTimeoutError,  # connect timeout
    aiohttp.ClientConnectorError,  # refused, unreachable
    aiohttp.ServerDisconnectedError,  # a stale pooled connection, or closed on us
    aiohttp.ClientConnectionResetError,
    aiohttp.ClientOSError,
)


def _payload(data: bytes | None) -> bytes | io.BytesIO | None:
    return io.BytesIO(data) if data is not None and len(data) > _ONE_WRITE_BYTES else data


class Overloaded(ProxyError):
    """A stream budget is spent: the model's share of `max_streams` or the process's (503; the
    client should retry shortly). The message says which."""

    status_hint = 503
    error_type = "overloaded"
    retry_after = 1


class NoUpstream(UpstreamUnavailable):
    """Every upstream is unhealthy or ejected (503)."""

    status_hint = 503
    public_message = "no upstream is available right now"


class Exchange:
    """One request to one upstream and its response, with its read deadlines.

    The time-to-first-byte and idle timeouts are watched by one timer per exchange, not by a
    timeout around every read: at one event per read, a timeout object per read was a tenth of
    the relay's CPU. The timer looks at how many bytes have arrived (not how many were read,
    so a stream held up by a slow client is not idle) and fails the pending read with
    `UpstreamTimeout` once nothing came for too long.
    """

    __slots__ = (
        "_arrived",
        "_loop",
        "_timer",
        "bytes_in",
        "first_byte_deadline",
        "idle_timeout",
        "response",
        "upstream",
    )

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        upstream: UpstreamState,
        first_byte_deadline: float | None,
        idle_timeout: float | None,
    ) -> None:
        self.response = response
        self.upstream = upstream
        self.first_byte_deadline = first_byte_deadline  # loop time by which body bytes must come
        self.idle_timeout = idle_timeout
        self.bytes_in = 0
        self._loop = asyncio.get_running_loop()
        self._arrived = 0
        self._timer: asyncio.TimerHandle | None = None
        self._watch(self._loop.time())

    def _watch(self, now: float) -> None:
        if self.first_byte_deadline is not None:
            when = self.first_byte_deadline
        elif self.idle_timeout is not None:
            when = now + self.idle_timeout
        else:
            return
        self._timer = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        content = self.response.content
        if content.at_eof():
            return
        arrived = content.total_bytes
        # Something came since the last look, or is waiting to be read (the proxy is the slow
        # side, held up by its client): not idle.
        if arrived != self._arrived or arrived > self.bytes_in:
            self._arrived = arrived
            self.first_byte_deadline = None
            self._watch(self._loop.time())
            return
        kind = "ttft" if self.first_byte_deadline is not None else "idle"
        content.set_exception(
            UpstreamTimeout(
                f"upstream sent nothing for too long ({kind} timeout)", code=f"{kind}_timeout"
            )
        )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def read(self, until: float | None = None) -> bytes | None:
        """The next body bytes as they arrive; `b""` at the end of the body; None if loop time
        `until` came first (the caller has something to do then, and reads again).

        Raises `UpstreamTimeout` past the time-to-first-byte or idle timeout.
        """
        content = self.response.content
        if until is None:
            chunk = await content.readany()
        else:
            try:
                async with asyncio.timeout_at(until):
                    chunk = await content.readany()
            except TimeoutError:
                return None
        self.bytes_in += len(chunk)
        if self.first_byte_deadline is not None:
            # The first bytes are in: from now on the idle timeout is what is watched.
            self.first_byte_deadline = None
            self.close()
            self._arrived = content.total_bytes
            self._watch(self._loop.time())
        return chunk


@dataclass
class ProcessStreams:
    """Upstream requests in flight across every model's pool, against `max_streams`."""

    limit: int
    in_flight: int = 0


class StreamBudget:
    """One model's upstream requests in flight, against its share of `max_streams`
    (`models[].max_streams`), and the process's (shared by every model's budget). A model
    whose backend stalls spends its own share, never every model's."""

    def __init__(
        self,
        limit: int,
        process: ProcessStreams | None = None,
        *,
        model: str = UNNAMED_MODEL,
        metrics: Metrics,
    ) -> None:
        self.limit = limit
        self.process = process or ProcessStreams(limit)  # alone: the process is the model
        self.in_flight = 0
        self._model = model
        self._metrics = metrics

    def take(self) -> None:
        """Count one request in, or raise `Overloaded` naming the budget that is spent."""
        process = self.process
        if self.in_flight >= self.limit:
            budget = "model"
            message = (
                f"{self.in_flight} requests in flight for model {self._model!r} (its share of "
                "max_streams); retry shortly"
            )
        elif process.in_flight >= process.limit:
            budget = "process"
            message = (
                f"{process.in_flight} requests in flight for every model together "
                "(max_streams); retry shortly"
            )
        else:
            self.in_flight += 1
            process.in_flight += 1
            return
        self._metrics.rejected.labels(self._model, budget).inc()
        raise Overloaded(message, code="overloaded")

    def give_back(self) -> None:
        self.in_flight -= 1
        self.process.in_flight -= 1


class UpstreamPool:
    """One model's upstreams, their health, and the session (shared) that reaches them."""

    def __init__(
        self,
        settings: Settings,
        session: aiohttp.ClientSession,
        metrics: Metrics,
        readiness: Readiness | None = None,
        *,
        upstreams: tuple[str, ...] | None = None,
        model: str = UNNAMED_MODEL,
        budget: StreamBudget | None = None,
    ) -> None:
        self.settings = settings
        self.session = session
        self.metrics = metrics
        self.readiness = readiness
        self.model = model  # the metric label
        self.budget = budget or StreamBudget(settings.max_streams, model=model, metrics=metrics)
        self.balancer = Balancer(
            upstreams or settings.upstream,
            eject_after=settings.eject_after,
            eject_seconds=settings.eject_seconds,
            max_ejection_percent=settings.max_ejection_percent,
            panic_threshold=settings.panic_threshold,
        )

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight

    @contextlib.asynccontextmanager
    async def open(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Iterable[tuple[str, str]],
        data: bytes | None,
    ) -> AsyncIterator[Exchange]:
        """Send a request upstream; yields once the response headers are in."""
        settings = self.settings
        budget = self.budget
        budget.take()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settings.ttft_timeout if settings.ttft_timeout else None
            exchange = await self._send(method, path_qs, CIMultiDict(headers), data, deadline)
            try:
                yield exchange
            finally:
                exchange.close()
                exchange.response.release()
                exchange.upstream.outstanding -= 1
        finally:
            budget.give_back()

    async def _send(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        data: bytes | None,
        deadline: float | None,
    ) -> Exchange:
        tried: set[str] = set()
        last_failure: BaseException | None = None
        stale_retries_left = 2  # the pool may hold more than one such connection
        while True:
            upstream = self.balancer.pick(time.monotonic(), exclude=frozenset(tried))
            if upstream is None:
                detail = "; ".join(
                    f"{u.url}: {u.last_error or 'unhealthy'}" for u in self.balancer.upstreams
                )
                # Tried and timed out: 504. Tried and refused: 502. None to try at all: 503.
                if isinstance(last_failure, aiohttp.ConnectionTimeoutError):
                    message = f"upstream connect timed out ({detail})"
                    raise UpstreamTimeout(message, code="connect_timeout") from last_failure
                if last_failure is not None:
                    message = f"upstream unreachable ({detail})"
                    raise UpstreamUnavailable(message, code="unreachable") from last_failure
                raise NoUpstream(f"no upstream available ({detail})", code="no_upstream")
            upstream.outstanding += 1
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self.session.request(
                        method,
                        URL(upstream.url.rstrip("/") + path_qs, encoded=True),
                        headers=headers,
                        # A fresh BytesIO per attempt: a retry sends the body from its start.
                        data=_payload(data),
                        allow_redirects=False,
                        skip_auto_headers=SKIP_AUTO_HEADERS,
                    )
            except _NOTHING_SENT as exc:
                upstream.outstanding -= 1
                last_failure = exc
                if isinstance(exc, _STALE) and stale_retries_left:
                    stale_retries_left -= 1
                    self.metrics.retries.inc()
                    continue
                if isinstance(exc, aiohttp.ConnectionTimeoutError):
                    self.metrics.timeouts.labels("connect").inc()
                self._failed(upstream, "connect", exc)
                tried.add(upstream.url)
                self.metrics.retries.inc()
                continue
            except TimeoutError as exc:
                # The time-to-first-byte budget ran out while waiting for response headers.
                upstream.outstanding -= 1
                self.metrics.timeouts.labels("ttft").inc()
                self._failed(upstream, "timeout", exc)
                raise UpstreamTimeout(
                    f"upstream {upstream.url} did not answer in time (ttft timeout)",
                    code="ttft_timeout",
                ) from exc
            except aiohttp.ClientError as exc:
                upstream.outstanding -= 1
                self._failed(upstream, "protocol", exc)
                raise UpstreamUnavailable(f"upstream {upstream.url} failed: {exc}") from exc
            if response.status >= 500:
                self.metrics.upstream_errors.labels("status_5xx", self.model).inc()
            if self.balancer.answered(upstream, response.status, time.monotonic()):
                self._ejected(upstream, f"answered {response.status}")
            return Exchange(response, upstream, deadline, self.settings.idle_timeout or None)

    def request(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Iterable[tuple[str, str]] | Mapping[str, str],
        data: bytes | None,
    ) -> aiohttp.client._RequestContextManager:
        """The proxy's own request (the drift check's probes) to the first available upstream.

        Not balanced, retried or counted as traffic. Every upstream must serve the same model,
        so probing one of them speaks for all.
        """
        now = time.monotonic()
        upstreams = self.balancer.upstreams
        target = next((u for u in upstreams if u.available(now)), upstreams[0])
        return self.session.request(
            method,
            URL(target.url.rstrip("/") + path_qs, encoded=True),
            headers=CIMultiDict(headers.items() if isinstance(headers, Mapping) else headers),
            data=data,
            allow_redirects=False,
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )

    def _failed(self, upstream: UpstreamState, kind: str, exc: BaseException) -> None:
        self.metrics.upstream_errors.labels(kind, self.model).inc()
        reason = f"{kind}: {exc!r}"
        if self.balancer.failed(upstream, time.monotonic(), reason):
            self._ejected(upstream, reason)

    def _ejected(self, upstream: UpstreamState, reason: str) -> None:
        self.metrics.ejections.inc()
        self._report()
        log.warning("upstream %s ejected for %.0fs after: %s", upstream.url,
                    self.settings.eject_seconds, reason)  # fmt: skip

    async def check_health(self) -> None:
        """One round of active checks: a 2xx (or a 404: no such endpoint) is healthy."""
        await asyncio.gather(*(self._check(u) for u in self.balancer.upstreams))
        self._report()

    def _report(self) -> None:
        """Tell readiness whether any upstream can take a request now: only active checks
        can say no, since ejection never takes out the last upstream in rotation."""
        if self.readiness is None:
            return
        available = self.balancer.any_available(time.monotonic())
        detail = "; ".join(f"{u.url}: {u.last_error or 'ok'}" for u in self.balancer.upstreams)
        self.readiness.update(
            Check("upstreams", ready=available, reason="ok" if available else "no_upstream",
                  detail=detail)
        )  # fmt: skip

    async def _check(self, upstream: UpstreamState) -> None:
        url = upstream.url.rstrip("/") + self.settings.health_path
        try:
            # A blackholed upstream must not stall the checks (or the start) for long.
            async with asyncio.timeout(min(max(1.0, self.settings.health_interval), 10.0)):
                async with self.session.get(
                    url, headers=HEALTH_CHECK_HEADERS, skip_auto_headers=SKIP_AUTO_HEADERS
                ) as resp:
                    await resp.read()
                    # 503 is llama.cpp's and vLLM's "still loading the model".
                    healthy = resp.status < 300 or resp.status == 404
                    error = None if healthy else f"health check answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            healthy, error = False, f"health check failed: {exc!r}"
        was = upstream.healthy
        self.balancer.checked(upstream, healthy=healthy, error=error)
        if was != healthy:
            state = "healthy" if healthy else f"unhealthy ({error})"
            log.warning("upstream %s is now %s", upstream.url, state)

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval)
            await self.check_health()


UPSTREAM = web.AppKey("upstream", UpstreamPool)


def make_session(settings: Settings) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=settings.pool_limit,
        limit_per_host=settings.pool_limit_per_host,
        keepalive_timeout=settings.keepalive_timeout,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout or None, sock_read=None
    )
    # auto_decompress=False: pass-through bytes stay exactly as the upstream sent them (A4).
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, raise_for_status=False
    )
