"""Whether a stream's upstream is read (proxy/server/data/flow.py): held by the client or by
the proxy's own buffer, each on its own, and read again only when neither holds it."""

from __future__ import annotations

import asyncio
from typing import cast

from proxy.server.data.exchange import Exchange
from proxy.server.data.flow import FlowControl


class Upstream:
    """What FlowControl asks of an exchange, recorded."""

    def __init__(self) -> None:
        self.complete = False
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def reading(self) -> bool:
        return not self.calls or self.calls[-1] == "resume"


def flow_of(upstream: Upstream, write_timeout: float, dropped: list[str]) -> FlowControl:
    return FlowControl(
        cast(Exchange, upstream),
        asyncio.get_running_loop(),
        write_timeout=write_timeout,
        on_write_timeout=lambda: dropped.append("dropped"),
    )


async def test_the_upstream_is_read_again_only_when_neither_holds_it() -> None:
    upstream, dropped = Upstream(), list[str]()
    flow = flow_of(upstream, 30.0, dropped)
    flow.hold()
    flow.pause_client()
    flow.resume_client()
    assert not upstream.reading()  # the proxy still holds it
    flow.pause_client()
    flow.release()
    assert not upstream.reading()  # the client still holds it
    flow.resume_client()
    assert upstream.reading()
    flow.end()
    assert dropped == []


async def test_a_client_that_takes_nothing_for_write_timeout_is_dropped_once() -> None:
    upstream, dropped = Upstream(), list[str]()
    flow = flow_of(upstream, 0.05, dropped)
    flow.pause_client()
    flow.pause_client()  # one timer, however often the transport says so
    await asyncio.sleep(0.2)
    assert dropped == ["dropped"]


async def test_a_resumed_or_ended_stream_drops_nobody() -> None:
    for finish in ("resume_client", "end"):
        upstream, dropped = Upstream(), list[str]()
        flow = flow_of(upstream, 0.05, dropped)
        flow.pause_client()
        getattr(flow, finish)()
        await asyncio.sleep(0.1)
        assert dropped == [], finish


async def test_at_the_end_the_upstream_waits_unless_its_response_is_whole() -> None:
    upstream, dropped = Upstream(), list[str]()
    flow_of(upstream, 0.0, dropped).end()
    assert upstream.calls == ["pause"]  # for the control plane to drain or close
    upstream = Upstream()
    upstream.complete = True
    flow_of(upstream, 0.0, dropped).end()
    assert upstream.calls == []
