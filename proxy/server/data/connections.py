"""Kept-alive HTTP/1.1 connections to the upstreams, one pool per worker.

* At most `limit` connections in all and `limit_per_host` to one origin (0: no per-origin
  limit), in use or idle; a request beyond them waits for one to come back.
* An idle connection is reused newest first, and closed after `keepalive_timeout` idle (0:
  never reused): below the backends' own idle timeouts (uvicorn's is 5 s), so the upstream
  rarely closes one just as a request is written on it. When it does anyway, the exchange sees
  `Disconnected(stale=True)` and the request is sent again, once, on a fresh connection
  (`upstreams.py`).
* `connect_timeout` bounds the TCP connect and the TLS handshake; `https://` upstreams are
  verified against the system's trust store (or `SSL_CERT_FILE`), with SNI and ALPN
  `http/1.1`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from proxy.core.shown import without_credentials
from proxy.server.data.upstream_protocol import (
    ConnectFailed,
    ConnectTimedOut,
    UpstreamConnection,
)

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an upstream URL's requests go, and what its own URL says about them."""

    scheme: str
    host: str
    port: int
    # `Host` as sent (RFC 9112 §3.2): the port only when it is not the scheme's default.
    host_header: str
    # The path the URL names (a backend mounted under a prefix), without a trailing slash.
    base_path: str
    # `Authorization` for credentials in the URL (`http://user:pass@host`), as aiohttp sent
    # them: Basic (RFC 7617).
    authorization: str | None

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(
                f"not an http:// or https:// URL with a host: {without_credentials(repr(url))}"
            )
        port = parts.port or _DEFAULT_PORTS[scheme]
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return cls(scheme, host, port, host_header, parts.path.rstrip("/"), authorization)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


def default_ssl_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


class ConnectionPool:
    def __init__(
        self,
        *,
        limit: int,
        limit_per_host: int,
        keepalive_timeout: float,
        connect_timeout: float | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.limit = limit
        self.limit_per_host = limit_per_host
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout or None
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[UpstreamConnection]] = {}
        self._expiry: dict[UpstreamConnection, asyncio.TimerHandle] = {}
        self._open: dict[tuple[str, str, int], set[UpstreamConnection]] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False

    @property
    def open_connections(self) -> int:
        return sum(len(conns) for conns in self._open.values())

    @property
    def idle_connections(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    async def connection(self, origin: Origin, *, fresh: bool = False) -> UpstreamConnection:
        """An idle kept-alive connection to `origin`, or a new one once the limits allow
        (`fresh`: always a new one). Raises `ConnectFailed` (and `ConnectTimedOut`)."""
        key = origin.key
        while True:
            if self._closing:
                raise ConnectFailed("the connection pool is closed")
            idle = None if fresh else self._idle.get(key)
            while idle:
                conn = idle.pop()
                self._unexpire(conn)
                if not conn.closed:
                    return conn
            if self._room_for(key):
                return await self._connect(origin)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def release(self, conn: UpstreamConnection, origin: Origin) -> None:
        """The exchange on `conn` is over: kept for the next request if it can be, else
        closed."""
        if conn.reusable and self.keepalive_timeout and not self._closing:
            conn.released()
            self._idle.setdefault(origin.key, []).append(conn)
            loop = asyncio.get_running_loop()
            self._expiry[conn] = loop.call_later(self.keepalive_timeout, conn.close)
        else:
            conn.close()
        self._wake()

    async def close(self) -> None:
        """Close every connection, idle or in use; wait until they are closed."""
        self._closing = True
        conns = [conn for conns in self._open.values() for conn in conns]
        for conn in conns:
            conn.close()
        for handle in self._expiry.values():
            handle.cancel()
        self._expiry.clear()
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=1)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- internal --------------------------------------------------------------------------------

    def _room_for(self, key: tuple[str, str, int]) -> bool:
        if self.limit_per_host and len(self._open.get(key, ())) >= self.limit_per_host:
            return self._evict_idle(key)
        if self.open_connections >= self.limit:
            return self._evict_idle(None)
        return True

    def _evict_idle(self, key: tuple[str, str, int] | None) -> bool:
        """Close one idle connection (to `key`, or to any origin) to make room."""
        for origin, idle in self._idle.items():
            if idle and (key is None or origin == key):
                conn = idle.pop(0)  # the longest idle
                self._unexpire(conn)
                self._open.get(origin, set()).discard(conn)
                conn.close()
                return True
        return False

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        key = origin.key
        conns = self._open.setdefault(key, set())
        holder: list[UpstreamConnection] = []

        def made() -> UpstreamConnection:
            conn = UpstreamConnection(loop, on_closed=lambda: self._closed(origin, conn))
            holder.append(conn)
            conns.add(conn)
            return conn

        tls = origin.scheme == "https"
        context = (self._ssl_context or default_ssl_context()) if tls else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(
                    made,
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if tls else None,
                    ssl_handshake_timeout=self.connect_timeout if tls else None,
                )
        except TimeoutError as exc:
            self._abandon(origin, holder)
            raise ConnectTimedOut(f"connect to {origin.host}:{origin.port} timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            self._abandon(origin, holder)
            raise ConnectFailed(f"connect to {origin.host}:{origin.port} failed: {exc}") from exc
        except BaseException:
            self._abandon(origin, holder)
            raise
        return holder[0]

    def _abandon(self, origin: Origin, holder: list[UpstreamConnection]) -> None:
        for conn in holder:
            self._forget(origin, conn)
            conn.close()
        self._wake()

    def _closed(self, origin: Origin, conn: UpstreamConnection) -> None:
        self._unexpire(conn)
        self._forget(origin, conn)
        self._wake()

    def _forget(self, origin: Origin, conn: UpstreamConnection) -> None:
        key = origin.key
        self._open.get(key, set()).discard(conn)
        idle = self._idle.get(key)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def _unexpire(self, conn: UpstreamConnection) -> None:
        handle = self._expiry.pop(conn, None)
        if handle is not None:
            handle.cancel()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
