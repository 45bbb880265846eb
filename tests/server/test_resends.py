"""What is sent again, and what is held against which upstream, when an upstream reads a
request and closes the connection without answering (proxy/server/data/upstreams.py).

That is what a backend does when an input crashes it: sent on to the next replica, such a
request would walk through every one of them and take half the pool out of rotation with it.
A request goes to another upstream only when it provably never reached one; a kept-alive
connection found closed is sent on once, on a fresh connection to the same upstream; the rest
is a 502, held against the one upstream, unless `resend_unanswered_requests` says otherwise.
"""

from __future__ import annotations

import time

import pytest

from tests.server.conftest import MakeProxy, ProxyClient, default_model
from tests.server.raw_upstream import StartUpstream, json_answer

# What the data plane does with a connection, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

DEADLY = b"query of death"
PAYLOADS = [
    {"prompt": DEADLY.decode(), "max_tokens": 4},
    {"prompt": DEADLY.decode(), "max_tokens": 4, "stream_format": "msgpack"},
    {"prompt": DEADLY.decode(), "max_tokens": 4, "stream": True},
]


def crashes_on_the_deadly_prompt(body: bytes) -> bytes | None:
    """A backend that dies of one input: it reads the request whole and drops the connection."""
    return None if DEADLY in body else json_answer()


def always_closes(body: bytes) -> bytes | None:
    return None


async def metrics_text(proxy: ProxyClient) -> str:
    async with proxy.get("/metrics") as resp:
        return await resp.text()


def failures(proxy: ProxyClient) -> list[int]:
    """Each upstream's count towards ejection, in configured order."""
    return [u.consecutive_failures for u in default_model(proxy).pool.balancer.upstreams]


def ejected(proxy: ProxyClient) -> list[bool]:
    now = time.monotonic()
    return [u.ejected(now) for u in default_model(proxy).pool.balancer.upstreams]


async def post_deadly(proxy: ProxyClient, payload: dict[str, object]) -> None:
    async with proxy.post("/v1/completions", json=payload) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "upstream_closed"


async def test_a_request_an_upstream_closed_unanswered_reaches_no_other(
    make_proxy: MakeProxy, raw_upstream: StartUpstream
) -> None:
    # A cold pool: every connection is new, so each close came after the request was read.
    upstreams = [await raw_upstream(crashes_on_the_deadly_prompt) for _ in range(4)]
    proxy = await make_proxy(upstream=tuple(u.url for u in upstreams), health_interval=60)
    for sent, payload in enumerate(PAYLOADS, start=1):
        before = [u.count(DEADLY) for u in upstreams]
        await post_deadly(proxy, payload)
        reached = [u.count(DEADLY) - b for u, b in zip(upstreams, before, strict=True)]
        # Delivered once, to one upstream, and held against that one alone.
        assert sorted(reached) == [0, 0, 0, 1], payload
        assert sum(failures(proxy)) == sent
        assert failures(proxy)[reached.index(1)] >= 1
    text = await metrics_text(proxy)
    assert 'codec_proxy_upstream_errors_total{kind="closed",model="default"} 3.0' in text
    assert 'kind="connect"' not in text
    assert "codec_proxy_retries_total 0.0" in text
    # Three such requests against four upstreams (eject_after 3) take none out of rotation.
    assert "codec_proxy_upstream_ejections_total 0.0" in text
    assert ejected(proxy) == [False] * 4
    async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
        assert resp.status == 200


async def test_a_kept_alive_connection_closed_unanswered_is_sent_on_once_on_a_fresh_one(
    make_proxy: MakeProxy, raw_upstream: StartUpstream
) -> None:
    # A warm pool: each upstream holds a kept-alive connection from an answered request.
    upstreams = [await raw_upstream(crashes_on_the_deadly_prompt) for _ in range(3)]
    proxy = await make_proxy(upstream=tuple(u.url for u in upstreams), health_interval=60)
    for _ in upstreams:
        async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
            assert resp.status == 200
    assert [u.connections for u in upstreams] == [1, 1, 1]
    assert default_model(proxy).pool.connections.idle_connections == 3
    await post_deadly(proxy, PAYLOADS[0])
    reached = [u.count(DEADLY) for u in upstreams]
    # The kept-alive connection's close could have been the stale-connection race: sent again
    # on a new connection to the same upstream, once; that close is the upstream's.
    assert sorted(reached) == [0, 0, 2]
    hit = upstreams[reached.index(2)]
    assert hit.connections == 2
    assert sorted(failures(proxy)) == [0, 0, 1]
    text = await metrics_text(proxy)
    assert 'codec_proxy_upstream_errors_total{kind="closed",model="default"} 1.0' in text
    assert "codec_proxy_retries_total 1.0" in text
    assert "codec_proxy_upstream_ejections_total 0.0" in text


async def test_resend_unanswered_requests_sends_it_on_and_holds_it_against_one(
    make_proxy: MakeProxy, raw_upstream: StartUpstream
) -> None:
    upstreams = [await raw_upstream(crashes_on_the_deadly_prompt) for _ in range(3)]
    proxy = await make_proxy(
        upstream=tuple(u.url for u in upstreams),
        health_interval=60,
        eject_after=1,
        resend_unanswered_requests=True,
    )
    await post_deadly(proxy, PAYLOADS[0])
    assert [u.count(DEADLY) for u in upstreams] == [1, 1, 1]  # each once, as asked
    assert sum(failures(proxy)) + sum(ejected(proxy)) == 1  # held against the first only
    text = await metrics_text(proxy)
    assert 'codec_proxy_upstream_errors_total{kind="closed",model="default"} 3.0' in text
    assert "codec_proxy_retries_total 2.0" in text
    assert "codec_proxy_upstream_ejections_total 1.0" in text


@pytest.mark.parametrize("resend", [False, True])
async def test_an_upstream_that_drops_every_request_is_passed_over_only_when_asked(
    make_proxy: MakeProxy, raw_upstream: StartUpstream, resend: bool
) -> None:
    dying = await raw_upstream(always_closes)
    healthy = await raw_upstream(crashes_on_the_deadly_prompt)
    proxy = await make_proxy(
        upstream=(dying.url, healthy.url),
        health_interval=60,
        eject_after=10,
        resend_unanswered_requests=resend,
    )
    statuses = []
    for _ in range(4):
        async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
            statuses.append(resp.status)
    assert dying.received  # taken in turn with the other
    if resend:
        assert statuses == [200] * 4
        assert len(healthy.received) == 4
    else:
        assert statuses.count(502) == len(dying.received)
        assert statuses.count(200) == len(healthy.received)
