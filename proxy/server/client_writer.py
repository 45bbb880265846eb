"""Writes to one client: awaited (backpressure), bounded in time, accounted once.

Awaiting each write means a client that reads slowly slows our reads from the upstream, instead
of us buffering its stream (peers.md A10). A client that stops reading altogether is dropped
after `write_timeout`, and with it the upstream request, so it holds neither memory nor a
backend slot.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from proxy.server.metrics import Metrics
from proxy.server.observe import RequestRecord


class ClientStalled(ConnectionResetError):
    """The client did not take our bytes within the write timeout; it is dropped."""


class ClientWriter:
    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        *,
        metrics: Metrics,
        record: RequestRecord,
        write_timeout: float,
        encoding: str = "identity",
    ) -> None:
        self._request = request
        self._response = response
        self._metrics = metrics
        self._record = record
        self._timeout = write_timeout or None
        self._bytes = metrics.bytes_out.labels(record.mode, encoding)
        self._gap = metrics.inter_token_gap.labels(record.mode)

    async def write(self, data: bytes) -> None:
        if not data:
            return
        try:
            async with asyncio.timeout(self._timeout):
                await self._response.write(data)
        except TimeoutError as exc:
            self._metrics.timeouts.labels("write").inc()
            self._record.outcome = "slow_client"
            if self._request.transport is not None:
                self._request.transport.close()
            raise ClientStalled("client stopped reading") from exc
        first = self._record.ttft is None
        gap = self._record.wrote(len(data), time.monotonic())
        self._bytes.inc(len(data))
        if first and self._record.ttft is not None:
            self._metrics.ttft.labels(self._record.mode).observe(self._record.ttft)
        elif gap is not None:
            self._gap.observe(gap)

    async def close(self) -> None:
        async with asyncio.timeout(self._timeout):
            await self._response.write_eof()
        self._record.status = self._response.status
        self._record.completed = True
