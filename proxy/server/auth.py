"""Optional local API keys: `Authorization: Bearer <key>`, compared in constant time.

Probes, metrics and the public Codec documents (discovery, schema) stay open: a kubelet or a
Prometheus scraper has no key, and tokenizer maps are fetched by browsers as CORS-simple GETs,
which cannot carry an Authorization header. The Authorization header itself is forwarded to the
upstream unchanged, as every end-to-end header is.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.core.errors import ProxyError
from proxy.server.local import LOCAL_PATHS

OPEN_PATHS = frozenset(LOCAL_PATHS)
OPEN_PREFIXES = ("/.well-known/codec/",)


class Unauthorized(ProxyError):
    """No valid local API key (401)."""

    status_hint = 401
    error_type = "authentication_error"


def _presented_key(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def api_key_middleware(keys: frozenset[str]) -> Middleware | None:
    """A middleware that checks keys, or None when no key is configured."""
    if not keys:
        return None
    encoded = [key.encode() for key in sorted(keys)]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return await handler(request)
        presented = _presented_key(request).encode()
        # Compare with every key, always: the time taken says nothing about which one is close.
        matches = [hmac.compare_digest(presented, key) for key in encoded]
        if not presented or not any(matches):
            raise Unauthorized("missing or invalid API key", code="invalid_api_key")
        return await handler(request)

    return check
