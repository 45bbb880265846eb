"""Optional local API keys: `Authorization: Bearer <key>`, compared in constant time.

Only what the proxy answers itself stays open: probes, metrics and the public Codec documents
(discovery, schema), every method of them (the ones they do not take get their JSON 405). A
kubelet or a Prometheus scraper has no key, and tokenizer maps are fetched by browsers as
CORS-simple GETs, which cannot carry an Authorization header. Whether a request is open is
decided by the route that answers it, never by its path: a path the router does not send to a
local handler (`/codec%2Fschema`) goes upstream, so it needs a key.

With keys, the client's Authorization header is the proxy's key: it is not sent upstream unless
`forward_authorization` says so. Without keys it passes through, as every end-to-end header does.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Iterable

from aiohttp import web

from proxy.core.errors import ProxyError
from proxy.server.models.live import config_of


class Unauthorized(ProxyError):
    """No valid local API key (401)."""

    status_hint = 401
    error_type = "authentication_error"

    def __init__(self, message: str, *, presented: bool) -> None:
        super().__init__(message, code="invalid_api_key")
        # RFC 6750 §3: the Bearer challenge; §3.1: "invalid_token" when a key was presented.
        self.www_authenticate = (
            'Bearer realm="codec-proxy", error="invalid_token"'
            if presented
            else 'Bearer realm="codec-proxy"'
        )


def presented_key(request: web.Request) -> str:
    """The request's Bearer token ("" without one)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class KeyCheck:
    """Checks the keys of the request's configuration (none: every request passes; a reload
    may add or remove them). `open_routes` are answered without one. Called by the edge's
    middleware (server/control/edge.py) before the handler; raises `Unauthorized`."""

    def __init__(self, *, open_routes: Iterable[web.RouteDef]) -> None:
        self._open_handlers = frozenset(route.handler for route in open_routes)

    def __call__(self, request: web.Request) -> None:
        keys = config_of(request).api_keys
        if not keys or request.match_info.handler in self._open_handlers:
            return
        presented = presented_key(request).encode()
        # Compare with every key, always: the time taken says nothing about which one is close.
        matches = [hmac.compare_digest(presented, key) for key in _encoded(keys)]
        if not presented:
            raise Unauthorized("missing API key", presented=False)
        if not any(matches):
            raise Unauthorized("invalid API key", presented=True)


@functools.lru_cache(maxsize=4)
def _encoded(keys: frozenset[str]) -> tuple[bytes, ...]:
    """A snapshot's keys as compared, made once per snapshot (a reload brings new ones)."""
    return tuple(key.encode() for key in sorted(keys))
