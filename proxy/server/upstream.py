"""The upstream side: one pooled `ClientSession` per process, owned by the app's cleanup_ctx."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from proxy.settings import Settings

# aiohttp's client adds these when a request lacks them; a transparent proxy must not.
SKIP_AUTO_HEADERS = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})


class Upstream:
    """Where requests go, and the connection pool that takes them there."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session

    def request(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Iterable[tuple[str, str]],
        data: bytes | None,
    ) -> aiohttp.client._RequestContextManager:
        return self.session.request(
            method,
            URL(self.base_url + path_qs, encoded=True),
            headers=CIMultiDict(headers),
            data=data,
            allow_redirects=False,
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )


def make_session(settings: Settings) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=settings.pool_limit,
        limit_per_host=settings.pool_limit_per_host,
        keepalive_timeout=settings.keepalive_timeout,
    )
    # No total timeout: a long generation is not a failure (peers.md A2). Connect is bounded.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout)
    # auto_decompress=False: pass-through bytes stay exactly as the upstream sent them (A4).
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, raise_for_status=False
    )
