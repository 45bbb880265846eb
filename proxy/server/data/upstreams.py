"""One model's upstreams: which one a request goes to, retries, ejection, health, timeouts.

- Each request goes to the routable upstream with the fewest requests in flight
  (`proxy/core/backend/balancer.py`); active health checks and passive ejection decide which are
  routable. Only connect failures, timeouts, closes without an answer, malformed heads and
  502/503/504 count towards ejection, never a 500, 501 or 4xx (one request's problem); what a
  request may have caused counts against one upstream at most; and the last upstream in
  rotation is never ejected.
- A request goes to another upstream only when it provably never reached one: the connect
  failed, or nothing of it was written. A kept-alive connection that closes unanswered is sent
  on again once, on a fresh connection to the same upstream, and held against no one: the
  upstream had most likely closed it while it sat in the pool (llama.cpp half-closes after a
  streamed response, uvicorn closes idle ones after 5 s). An upstream that read the request on
  a fresh connection and closed without answering may have run it, or died of it (a query of
  death would walk through every replica): a 502, counted as `closed`, unless
  `resend_unanswered_requests` sends it on. An upstream's answer, even a 5xx, is final.
- Timeouts: connect; time to first byte (headers and first body chunk share one budget); idle
  between chunks. No total timeout: a long generation is not a failure (peers.md A2). Under a
  time-to-first-byte budget, what clears an upstream's failure count is its first body byte,
  not its head.
- More than a model's share of `max_streams` in flight for that model, or more than
  `max_streams` for every model together, is shed with 503 + Retry-After before any work.

Requests go out on the data plane's own kept-alive connections (`connections.py`); the proxy's
own requests (health checks, the drift check's probes, `/v1/models`) use an aiohttp
`ClientSession`, where a coroutine per read costs nothing that matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from proxy.core.backend.balancer import Balancer, UpstreamState, is_gateway_failure
from proxy.core.backend.readiness import Check, Readiness
from proxy.core.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from proxy.core.http.framing import request_head
from proxy.core.http.headers import TRACE_CONTEXT_FIELDS
from proxy.core.http.response_head import MAX_REASON_BYTES
from proxy.server.data.connections import ConnectionPool, Origin
from proxy.server.data.context import StreamContext
from proxy.server.data.exchange import Exchange
from proxy.server.data.upstream_protocol import (
    ConnectTimedOut,
    Disconnected,
    UpstreamConnection,
    UpstreamConnectionError,
    proxy_error,
)
from proxy.server.telemetry.metrics import Metrics
from proxy.server.telemetry.request_trace import RequestTrace, UpstreamAttempt
from proxy.settings import UNNAMED_MODEL, Settings

log = logging.getLogger("codec_proxy")

# aiohttp's client adds these when a request lacks them; a transparent proxy must not.
SKIP_AUTO_HEADERS = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})

# Our own probes say who they are, so backend logs (and tests) can tell them from traffic.
HEALTH_CHECK_HEADERS = {"User-Agent": "codec-proxy-health-check"}

# The client's request head names these itself; the upstream request gets its own.
_OWN_REQUEST_FIELDS = frozenset({"host", "content-length", "expect"})
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "DELETE", "CONNECT"})


def _request_head(
    origin: Origin,
    method: str,
    path_qs: str,
    headers: list[tuple[str, str]],
    data: bytes | None,
    trace_context: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The upstream request's head: the client's end-to-end fields as given, its own `Host`
    and `Content-Length`, and the credentials of the upstream's URL when it has some (they
    replace the client's `Authorization`: the operator named them for this upstream), and the
    attempt's `trace_context` in place of the client's when the request is traced."""
    own = _OWN_REQUEST_FIELDS | ({"authorization"} if origin.authorization else set())
    if trace_context:
        # The caller's is the parent of the proxy's server span (or only its link), and the
        # backend's spans belong under the attempt's.
        own |= TRACE_CONTEXT_FIELDS
    fields = [("Host", origin.host_header)]
    fields += [(name, value) for name, value in headers if name.lower() not in own]
    if origin.authorization:
        fields.append(("Authorization", origin.authorization))
    fields += trace_context
    # A request that can carry a body says how long it is, also when it is empty (RFC 9110
    # §8.6), as aiohttp did.
    length = len(data) if data is not None else None
    if length is None and method not in _NO_BODY_METHODS:
        length = 0
    return request_head(method, origin.base_path + path_qs, fields, body_length=length)


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


@dataclass(frozen=True)
class UpstreamClients:
    """What reaches the upstreams, one of each per worker, shared by every model: the data
    plane's kept-alive connections, and a session for the proxy's own requests."""

    connections: ConnectionPool
    session: aiohttp.ClientSession

    @classmethod
    def for_settings(cls, settings: Settings) -> UpstreamClients:
        connections = ConnectionPool(
            limit=settings.pool_limit,
            limit_per_host=settings.pool_limit_per_host,
            keepalive_timeout=settings.keepalive_timeout,
            connect_timeout=settings.connect_timeout,
        )
        return cls(connections, make_session(settings))

    async def close(self) -> None:
        await self.connections.close()
        await self.session.close()


class UpstreamPool:
    """One model's upstreams, their health, and the clients (shared) that reach them."""

    def __init__(
        self,
        settings: Settings,
        clients: UpstreamClients,
        metrics: Metrics,
        readiness: Readiness | None = None,
        *,
        upstreams: tuple[str, ...] | None = None,
        model: str = UNNAMED_MODEL,
        budget: StreamBudget | None = None,
    ) -> None:
        self.settings = settings
        self.session = clients.session
        self.connections = clients.connections
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
        self._origins = {u.url: Origin.of(u.url) for u in self.balancer.upstreams}

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight

    @contextlib.asynccontextmanager
    async def open(
        self,
        context: StreamContext,
        *,
        method: str,
        path_qs: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
    ) -> AsyncIterator[Exchange]:
        """The one way a client request's upstream exchange is opened: sent upstream (to
        another upstream, or again, only as `_send` allows), yielding once the response head
        is in. The request's record, the active-streams gauge, the drain's count of streams in
        flight and the stream budget follow it; each attempt is a client span of the request's
        trace. At the end the exchange keeps, drains or closes its connection
        (`Exchange.end`)."""
        record = context.record
        record.mode = context.mode
        record.phase = "upstream_headers"
        metrics = context.metrics
        active = metrics.active_streams.labels(context.mode, context.model)
        active.inc()
        try:
            with context.lifecycle.tracking():
                self.budget.take()
                try:
                    ttft = self.settings.ttft_timeout
                    deadline = asyncio.get_running_loop().time() + ttft if ttft else None
                    exchange, attempt = await self._send(
                        method, path_qs, list(headers), body, deadline, context.trace
                    )
                    record.upstream = exchange.upstream.url
                    try:
                        yield exchange
                    finally:
                        # Also when the client hangs up mid-stream.
                        record.bytes_in = exchange.bytes_in
                        metrics.bytes_in.labels(context.mode, context.model).inc(exchange.bytes_in)
                        exchange.end()
                        exchange.upstream.outstanding -= 1
                        if attempt is not None:
                            attempt.ended()
                finally:
                    self.budget.give_back()
        finally:
            active.dec()

    async def _send(
        self,
        method: str,
        path_qs: str,
        headers: list[tuple[str, str]],
        data: bytes | None,
        deadline: float | None,
        trace: RequestTrace | None,
    ) -> tuple[Exchange, UpstreamAttempt | None]:
        tried: set[str] = set()
        last_failure: UpstreamConnectionError | None = None
        # The upstream whose pooled connection turned out closed: sent to again, on a fresh one.
        stale: UpstreamState | None = None
        # Whether an upstream was held to account for what this request may have caused: one
        # at most is.
        blamed = False
        resent = 0
        while True:
            upstream = stale or self.balancer.pick(time.monotonic(), exclude=frozenset(tried))
            fresh, stale = stale is not None, None
            if upstream is None:
                detail = "; ".join(
                    f"{u.url}: {u.last_error or 'unhealthy'}" for u in self.balancer.upstreams
                )
                if last_failure is None:
                    raise NoUpstream(f"no upstream available ({detail})", code="no_upstream")
                raise proxy_error(last_failure, f"none left to try: {detail}")
            if resent:
                self.metrics.retries.inc()
            upstream.outstanding += 1
            origin = self._origins[upstream.url]
            attempt = None if trace is None else trace.attempt(method, origin, path_qs, resent)
            resent += 1
            conn: UpstreamConnection | None = None
            try:
                async with asyncio.timeout_at(deadline):
                    conn = await self.connections.connection(origin, fresh=fresh)
                    head = await conn.request(
                        _request_head(
                            origin,
                            method,
                            path_qs,
                            headers,
                            data,
                            () if attempt is None else attempt.fields,
                        ),
                        data,
                        head_only=method == "HEAD",
                    )
            except BaseException as exc:
                # The attempt is over: nothing of it stays open upstream.
                upstream.outstanding -= 1
                if attempt is not None:
                    attempt.failed(exc)
                if conn is not None:
                    if not isinstance(exc, UpstreamConnectionError):
                        conn.close()  # a timeout or the client gone: abandon the request
                    self.connections.release(conn, origin)
                if isinstance(exc, TimeoutError):
                    # The time-to-first-byte budget ran out while waiting for the head.
                    self.metrics.timeouts.labels("ttft").inc()
                    self._failed(upstream, "timeout", exc, hold=not blamed)
                    raise proxy_error(exc, f"{upstream.url}, ttft timeout") from exc
                if not isinstance(exc, UpstreamConnectionError):
                    raise  # cancelled: the client left
                last_failure = exc
                if isinstance(exc, Disconnected) and exc.stale:
                    # The stale-connection race: not the upstream's failure, nor the request's.
                    # A fresh connection is never stale, so this happens once per upstream.
                    stale = upstream
                    continue
                if exc.nothing_sent:
                    # It never reached this upstream: the next one may have it.
                    if isinstance(exc, ConnectTimedOut):
                        self.metrics.timeouts.labels("connect").inc()
                    self._failed(upstream, "connect", exc)
                    tried.add(upstream.url)
                    continue
                if exc.nothing_received:
                    # It read the request, or some of it, and closed without a word: it may
                    # have run it, or died of it. Sent on only where the operator asked for it.
                    self._failed(upstream, "closed", exc, hold=not blamed)
                    blamed = True
                    if self.settings.resend_unanswered_requests:
                        tried.add(upstream.url)
                        continue
                else:
                    self._failed(upstream, "protocol", exc, hold=not blamed)
                raise proxy_error(exc, upstream.url) from exc
            if head.reason is None:
                log.warning(
                    "upstream %s answered %d with a reason phrase that is not relayed (a control "
                    "character, or over %d bytes): the status goes with the standard phrase",
                    upstream.url, head.status, MAX_REASON_BYTES,
                )  # fmt: skip
            if head.status >= 500:
                self.metrics.upstream_errors.labels("status_5xx", self.model).inc()
            answered = None
            if deadline is not None and not is_gateway_failure(head.status):
                # Its first body byte, not its head, clears the upstream's failures: one that
                # answers heads and then stalls is a failure each time (the ttft timeout), and
                # must reach `eject_after` like one that never answers.
                answered = functools.partial(self.balancer.succeeded, upstream)
            elif self.balancer.answered(upstream, head.status, time.monotonic()):
                self._ejected(upstream, f"answered {head.status}")
            if attempt is not None:
                attempt.answered(head.status)
            exchange = Exchange(
                self.connections,
                origin,
                conn,
                head,
                upstream,
                first_byte_deadline=deadline,
                idle_timeout=self.settings.idle_timeout or None,
                timed_out=functools.partial(self._timed_out, upstream),
                answered=answered,
            )
            return exchange, attempt

    def _timed_out(self, upstream: UpstreamState, kind: str, exc: UpstreamTimeout) -> None:
        """The exchange's watchdog fired: the first body byte never came (a ttft timeout,
        told to the balancer like one while waiting for the head), or the stream went idle."""
        self.metrics.timeouts.labels(kind).inc()
        if kind == "ttft":
            self._failed(upstream, "timeout", exc)

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

    def _failed(
        self, upstream: UpstreamState, kind: str, exc: BaseException, *, hold: bool = True
    ) -> None:
        """Count a failure of `kind`; `hold`: towards ejecting the upstream too (a request
        that reached several upstreams is held against the first only)."""
        self.metrics.upstream_errors.labels(kind, self.model).inc()
        reason = f"{kind}: {exc!r}"
        if hold and self.balancer.failed(upstream, time.monotonic(), reason):
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
