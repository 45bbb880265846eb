"""Least outstanding requests among routable upstreams; what ejects, its caps, recovery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.backend.balancer import Balancer


def test_least_outstanding_wins_and_ties_rotate() -> None:
    balancer = Balancer(("a", "b", "c"), eject_after=3, eject_seconds=10)
    a, b, c = balancer.upstreams
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    assert balancer.pick(0.0) is b
    b.outstanding = 1
    picks = {balancer.pick(0.0).url for _ in range(6)}  # type: ignore[union-attr]
    assert picks == {"b", "c"}  # the two with one in flight, in turn


def test_consecutive_failures_eject_then_time_brings_it_back() -> None:
    balancer = Balancer(("a", "b"), eject_after=2, eject_seconds=10)
    a, b = balancer.upstreams
    assert not balancer.failed(a, 100.0, "refused")
    balancer.succeeded(a)  # a success in between resets the count
    assert not balancer.failed(a, 100.0, "refused")
    assert balancer.failed(a, 100.0, "refused")  # two in a row: ejected
    assert all(balancer.pick(105.0) is b for _ in range(4))
    assert balancer.pick(105.0, exclude=frozenset({"b"})) is None
    assert balancer.pick(110.0, exclude=frozenset({"b"})) is a  # its time is up


def test_active_checks_take_out_and_bring_back() -> None:
    balancer = Balancer(("a",), eject_after=1, eject_seconds=60)
    (a,) = balancer.upstreams
    balancer.checked(a, healthy=False, error="503 loading model")
    assert not balancer.any_available(0.0)
    assert balancer.pick(0.0) is None
    balancer.failed(a, 0.0, "refused")
    balancer.checked(a, healthy=True)  # a good check also ends an ejection
    assert balancer.pick(1.0) is a


# --- what counts, and the caps on ejection ----------------------------------------------------


@pytest.mark.parametrize("status", [500, 501, 400, 404, 413, 422, 429, 200])
def test_answers_about_the_request_never_count(status: int) -> None:
    balancer = Balancer(("a", "b"), eject_after=2, eject_seconds=10)
    a, _ = balancer.upstreams
    assert not balancer.failed(a, 0.0, "refused")  # one real failure on the count...
    for _ in range(10):
        assert not balancer.answered(a, status, 0.0)
    assert a.consecutive_failures == 0  # ...which the working server's answer cleared
    assert a.last_error is None
    assert not a.ejected(0.0)


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_failures_count(status: int) -> None:
    balancer = Balancer(("a", "b"), eject_after=2, eject_seconds=10)
    a, b = balancer.upstreams
    assert not balancer.answered(a, status, 0.0)
    assert balancer.answered(a, status, 0.0)
    assert a.last_error == f"answered {status}"
    assert all(balancer.pick(5.0) is b for _ in range(4))


def test_the_only_upstream_is_never_ejected() -> None:
    balancer = Balancer(("a",), eject_after=1, eject_seconds=60, max_ejection_percent=100)
    (a,) = balancer.upstreams
    for now in range(20):
        assert not balancer.failed(a, float(now), "refused")
        assert not balancer.answered(a, 503, float(now))
        assert balancer.pick(float(now)) is a
    assert balancer.any_available(20.0)


def test_the_last_upstream_in_rotation_stays_even_at_100_percent() -> None:
    balancer = Balancer(("a", "b"), eject_after=1, eject_seconds=60, max_ejection_percent=100)
    a, b = balancer.upstreams
    assert balancer.failed(a, 0.0, "refused")
    assert not balancer.failed(b, 0.0, "refused")  # a is out: b is all that is left
    assert balancer.pick(1.0) is b
    # Nor when the other one is out by its active check rather than by ejection.
    balancer.checked(a, healthy=False, error="loading")
    balancer.checked(a, healthy=True)
    balancer.checked(b, healthy=False, error="loading")
    assert not balancer.failed(a, 2.0, "refused")
    assert balancer.pick(2.0) is a


def test_at_most_max_ejection_percent_sit_out() -> None:
    balancer = Balancer(("a", "b", "c", "d"), eject_after=1, eject_seconds=60)  # 50%: two
    a, b, c, d = balancer.upstreams
    assert balancer.failed(a, 0.0, "refused")
    assert balancer.failed(b, 0.0, "refused")
    assert not balancer.failed(c, 0.0, "refused")
    assert not balancer.failed(d, 0.0, "refused")
    assert {balancer.pick(1.0).url for _ in range(4)} == {"c", "d"}  # type: ignore[union-attr]


def test_capped_upstream_is_ejected_by_its_next_failure_once_allowed() -> None:
    balancer = Balancer(("a", "b"), eject_after=3, eject_seconds=10)
    a, b = balancer.upstreams
    for _ in range(3):
        balancer.failed(a, 0.0, "refused")
    assert a.ejected(0.0)
    for _ in range(3):
        assert not balancer.failed(b, 5.0, "refused")  # the last one in rotation
    assert b.consecutive_failures == 3
    assert balancer.failed(b, 10.0, "refused")  # a's time is up: b may sit out now
    assert balancer.pick(11.0) is a


def test_panic_routes_to_every_healthy_upstream() -> None:
    balancer = Balancer(("a", "b", "c", "d"), eject_after=1, eject_seconds=60)
    a, b, c, d = balancer.upstreams
    balancer.failed(a, 0.0, "refused")
    balancer.failed(b, 0.0, "refused")
    assert balancer.routable(1.0) == (c, d)  # half in rotation: not below 50%
    balancer.checked(d, healthy=False, error="loading")  # one in four left: panic
    assert balancer.routable(1.0) == (a, b, c)  # the ejections are ignored
    assert balancer.pick(1.0, exclude=frozenset({"c"})) in (a, b)
    balancer.checked(d, healthy=True)
    assert balancer.routable(1.0) == (c, d)


def test_panic_threshold_zero_still_never_leaves_nothing() -> None:
    balancer = Balancer(("a", "b"), eject_after=1, eject_seconds=60, panic_threshold=0)
    a, b = balancer.upstreams
    assert balancer.failed(a, 0.0, "refused")
    balancer.checked(b, healthy=False, error="loading")
    assert balancer.pick(1.0) is a  # ejected, but the only one that passes its active check


# --- the invariants, for any sequence of outcomes ---------------------------------------------

URLS = "abcdef"
Op = tuple[str, int, int]  # (what, which upstream, a status or seconds)


@st.composite
def operations(draw: st.DrawFn, n: int) -> list[Op]:
    which = st.integers(0, n - 1)
    statuses = st.sampled_from([200, 400, 404, 500, 501, 502, 503, 504])
    op = st.one_of(
        st.tuples(st.just("failed"), which, st.just(0)),
        st.tuples(st.just("failed"), which, st.just(0)),  # twice: ejections must happen
        st.tuples(st.just("answered"), which, statuses),
        st.tuples(st.just("checked"), which, st.sampled_from([0, 1])),
        st.tuples(st.just("wait"), st.just(0), st.integers(0, 15)),
    )
    return draw(st.lists(op, max_size=60))


Scenario = tuple[Balancer, int, list[Op]]  # the balancer, its max_ejection_percent, what happens


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, len(URLS)))
    # The edges (0, 100, exactly one upstream's share) more often than uniform draws give them.
    percents = st.sampled_from([0, 25, 34, 50, 100]) | st.integers(0, 100)
    max_ejection_percent = draw(percents)
    balancer = Balancer(
        tuple(URLS[:n]),
        eject_after=draw(st.integers(1, 3)),
        eject_seconds=draw(st.sampled_from([0.0, 10.0, 60.0])),
        max_ejection_percent=max_ejection_percent,
        panic_threshold=draw(percents),
    )
    return balancer, max_ejection_percent, draw(operations(n))


@given(scenarios())
def test_ejection_never_leaves_nothing_to_route_to(scenario: Scenario) -> None:
    """Whatever the outcomes: `pick` finds an upstream unless every one fails its active check,
    so `/readyz` never says no because of what requests caused; at most `max_ejection_percent`
    of the upstreams are ejected and at least one never is; a lone upstream is never ejected."""
    balancer, max_ejection_percent, ops = scenario
    ups = balancer.upstreams
    n = len(ups)
    now = 0.0
    for what, index, arg in ops:
        upstream = ups[index]
        if what == "failed":
            ejected = balancer.failed(upstream, now, "refused")
        elif what == "answered":
            ejected = balancer.answered(upstream, arg, now)
            assert not ejected or arg in (502, 503, 504)
        elif what == "checked":
            balancer.checked(upstream, healthy=bool(arg), error=None if arg else "down")
            ejected = False
        else:
            now += arg
            ejected = False
        assert not (ejected and n == 1)
        out = sum(u.ejected(now) for u in ups)
        assert 100 * out <= max_ejection_percent * n
        assert out < n
        any_healthy = any(u.healthy for u in ups)
        assert (balancer.pick(now) is not None) == any_healthy
        assert balancer.any_available(now) == any_healthy


@given(scenarios(), st.lists(st.sampled_from([400, 404, 413, 422, 429, 500, 501]), max_size=40))
def test_request_errors_alone_never_eject(scenario: Scenario, statuses: list[int]) -> None:
    balancer, _, _ = scenario
    for i, status in enumerate(statuses):
        upstream = balancer.upstreams[i % len(balancer.upstreams)]
        assert not balancer.answered(upstream, status, float(i))
    assert all(u.available(1e9) and u.consecutive_failures == 0 for u in balancer.upstreams)
