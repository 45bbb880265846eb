"""Which streams are verified, and when mismatches trip the window: draws and times passed in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.verify.sampling import MismatchWindow, Sampler


def never_called() -> float:
    raise AssertionError("the draw must not be called at rate 0 or 1")


def test_rate_zero_never_and_one_always_without_drawing() -> None:
    assert not any(Sampler(0.0, never_called).pick() for _ in range(100))
    assert all(Sampler(1.0, never_called).pick() for _ in range(100))


def test_a_rate_picks_draws_below_it() -> None:
    draws = itertools.cycle([0.0, 0.24, 0.25, 0.9, 0.999])
    sampler = Sampler(0.25, lambda: next(draws))
    assert [sampler.pick() for _ in range(5)] == [True, True, False, False, False]
    assert sampler.rate == 0.25


@given(rate=st.floats(0.0, 1.0), draw=st.floats(0.0, 1.0, exclude_max=True))
def test_pick_is_the_draw_against_the_rate(rate: float, draw: float) -> None:
    picked = Sampler(rate, lambda: draw).pick()
    assert picked == (rate == 1.0 or (rate > 0.0 and draw < rate))


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_a_rate_outside_zero_to_one_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="sample rate"):
        Sampler(rate, never_called)


def test_the_window_trips_at_the_threshold_within_the_window() -> None:
    window = MismatchWindow(3, 10.0)
    assert [window.record(t) for t in (0.0, 4.0)] == [False, False]
    assert window.record(9.9)  # three within ten seconds
    assert window.record(12.0)  # 4.0, 9.9, 12.0: still three within ten
    assert not window.record(25.0)  # 9.9, 12.0, 25.0 span more than ten
    assert not window.record(30.0)
    assert window.record(34.9)


def test_the_window_edge_is_exclusive() -> None:
    window = MismatchWindow(2, 5.0)
    window.record(0.0)
    assert not window.record(5.0)
    assert window.record(9.99)


def test_reset_forgets_and_a_threshold_of_one_trips_at_once() -> None:
    window = MismatchWindow(2, 60.0)
    window.record(1.0)
    window.reset()
    assert not window.record(2.0)
    assert window.record(3.0)
    assert MismatchWindow(1, 1.0).record(0.0)


def test_threshold_zero_never_trips() -> None:
    window = MismatchWindow(0, 60.0)
    assert not any(window.record(float(t)) for t in range(1000))
    assert (window.threshold, window.window_seconds) == (0, 60.0)


@given(
    threshold=st.integers(1, 6),
    window_seconds=st.floats(0.5, 50.0),
    gaps=st.lists(st.floats(0.0, 20.0), max_size=40),
)
def test_the_window_trips_exactly_when_threshold_times_fit(
    threshold: int, window_seconds: float, gaps: list[float]
) -> None:
    window = MismatchWindow(threshold, window_seconds)
    times = list(itertools.accumulate(gaps))
    for index, now in enumerate(times):
        recent = [t for t in times[: index + 1] if now - t < window_seconds]
        assert window.record(now) == (len(recent) >= threshold)


@pytest.mark.parametrize(("threshold", "seconds"), [(-1, 10.0), (3, 0.0), (3, -1.0)])
def test_a_bad_window_is_refused(threshold: int, seconds: float) -> None:
    with pytest.raises(ValueError, match="mismatch"):
        MismatchWindow(threshold, seconds)
