"""Least outstanding requests among available upstreams; ejection and recovery."""

from __future__ import annotations

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
