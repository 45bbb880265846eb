"""The upstream's `GET /v1/models`: one fetch path for every use of it.

Path B names its model from it when `--model` is not set (`CodecRequest` has no model field,
codec-spec.md §3.3), the drift check reads the backend's vocabulary size from it, token-ID
prompts are bounded by the context length it gives, and `--backend auto` learns from it which
server the upstream is. The parsing is `proxy.core.backend.models` and `.kind`; this module does
the request and remembers the answer.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from proxy.core.backend.kind import BackendKind, detect_kind
from proxy.core.backend.models import (
    MODELS_PATH,
    ModelEntry,
    find_model,
    only_model,
    parse_models,
)
from proxy.core.errors import UpstreamUnavailable
from proxy.server.data.upstreams import UpstreamPool

log = logging.getLogger("codec_proxy")

_HEADERS = (("Accept", "application/json"), ("Accept-Encoding", "identity"))
_BODY_LIMIT = 1 << 20
_REQUEST_SECONDS = 10.0


class UpstreamModels:
    """The models the upstream lists, looked up on first use and remembered."""

    def __init__(self, pool: UpstreamPool, configured: str | None) -> None:
        self._pool = pool
        self._configured = configured
        self._listing: tuple[ModelEntry, ...] | None = None
        self._backend: BackendKind | None = None
        self._lock = asyncio.Lock()

    @property
    def configured(self) -> str | None:
        """`--model`: what requests that name no model are sent with."""
        return self._configured

    async def listing(self, *, fresh: bool = False) -> tuple[ModelEntry, ...]:
        """The upstream's models; `fresh` asks again instead of using the remembered answer.
        `UpstreamUnavailable` or `UpstreamProtocolError` when it cannot be had."""
        async with self._lock:  # one lookup, however many requests are waiting for it
            if self._listing is None or fresh:
                self._listing = await self._fetch()
            return self._listing

    async def default_name(self) -> str:
        """The model for requests that name none: `--model`, else the upstream's only one."""
        if self._configured is not None:
            return self._configured
        return only_model(await self.listing())

    def context_length(self) -> int | None:
        """The context length of the model requests use (`--model`, else the only one), as
        the last listing gave it; None before any listing, or when it did not say.

        Never looks it up: requests read it before they are parsed, and a lookup there would
        contact the upstream for requests it refuses. The drift check (at start, then every
        few minutes) and Path B's model lookup keep the listing.
        """
        entry = None if self._listing is None else find_model(self._listing, self._configured)
        return None if entry is None else entry.context_length

    def backend_kind(self) -> BackendKind | None:
        """The server the last listing showed (proxy/core/backend/kind.py); None before any
        listing, or when it did not say. Never looks it up, like `context_length`."""
        return self._backend

    async def _fetch(self) -> tuple[ModelEntry, ...]:
        try:
            async with asyncio.timeout(_REQUEST_SECONDS):
                async with self._pool.request(
                    "GET", MODELS_PATH, headers=_HEADERS, data=None
                ) as response:
                    status, body = response.status, await response.content.read(_BODY_LIMIT)
                    server = response.headers.get("Server")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnavailable(f"GET {MODELS_PATH} failed: {exc!r}") from exc
        listing = parse_models(status, body)
        backend = detect_kind((entry.backend for entry in listing), server)
        if backend != self._backend:
            log.info(
                "GET %s shows the upstream is %s",
                MODELS_PATH,
                backend or "no server the proxy knows (vllm, llamacpp, sglang)",
            )
            self._backend = backend
        return listing
