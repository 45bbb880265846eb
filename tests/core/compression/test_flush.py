"""The flush policy (pure, time passed in) and the merging of a flush window's frames."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.compression.flush import FlushConfig, FlushPolicy, merge_frames
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall


def test_first_frame_is_flushed_at_once() -> None:
    policy = FlushPolicy(FlushConfig(interval_ms=1000, max_frames=100))
    assert policy.on_frame(5.0)
    policy.flushed()
    assert not policy.on_frame(5.001)


def test_later_frames_wait_for_the_oldest_to_reach_the_interval() -> None:
    policy = FlushPolicy(FlushConfig(interval_ms=50, max_frames=100))
    policy.on_frame(0.0)
    policy.flushed()
    assert not policy.on_frame(1.0)
    assert policy.deadline() == pytest.approx(1.05)
    assert not policy.on_frame(1.03)
    assert policy.deadline() == pytest.approx(1.05)  # the oldest frame sets it
    assert not policy.due(1.049)
    assert policy.due(1.05)
    assert policy.on_frame(1.06)  # past the deadline: flush with this frame
    policy.flushed()
    assert policy.deadline() is None
    assert policy.pending == 0


def test_frame_count_flushes() -> None:
    policy = FlushPolicy(FlushConfig(interval_ms=1000, max_frames=3))
    policy.on_frame(0.0)
    policy.flushed()
    assert not policy.on_frame(0.1)
    assert not policy.on_frame(0.1)
    assert policy.on_frame(0.1)


def test_terminal_frame_flushes() -> None:
    policy = FlushPolicy(FlushConfig(interval_ms=1000, max_frames=100))
    policy.on_frame(0.0)
    policy.flushed()
    assert not policy.on_frame(0.1)
    assert policy.on_frame(0.1, terminal=True)


@pytest.mark.parametrize(("interval", "frames"), [(0, 100), (100, 0), (100, 1)])
def test_zero_means_every_frame(interval: float, frames: int) -> None:
    policy = FlushPolicy(FlushConfig(interval_ms=interval, max_frames=frames))
    for step in range(5):
        assert policy.on_frame(float(step))
        policy.flushed()


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        FlushConfig(interval_ms=-1, max_frames=1)
    with pytest.raises(ValueError, match="count"):
        FlushConfig(interval_ms=1, max_frames=-1)


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=0.2), min_size=1, max_size=60),
    interval_ms=st.sampled_from([0, 10, 25, 50, 100, 250]),
    max_frames=st.integers(min_value=0, max_value=10),
)
def test_no_frame_waits_past_its_deadline(
    gaps: list[float], interval_ms: int, max_frames: int
) -> None:
    """Driven as the edge drives it (a timer at `deadline()`), no frame waits longer than the
    interval, and no more than `max_frames` frames are ever pending."""
    policy = FlushPolicy(FlushConfig(interval_ms=interval_ms, max_frames=max_frames))
    now = 0.0
    arrivals: list[float] = []
    waits: list[float] = []

    def flush(at: float) -> None:
        waits.extend(at - t for t in arrivals)
        arrivals.clear()
        policy.flushed()

    for index, gap in enumerate(gaps):
        now += gap
        deadline = policy.deadline()
        if deadline is not None and deadline <= now:
            flush(deadline)  # the timer fires before the next frame arrives
        arrivals.append(now)
        if policy.on_frame(now, terminal=index == len(gaps) - 1):
            flush(now)
        if max_frames > 1:
            assert policy.pending < max_frames
    assert not arrivals
    assert max(waits) <= interval_ms / 1000 + 1e-9
    assert waits[0] == 0.0  # the first frame never waits


def test_merge_joins_the_window_and_keeps_the_terminal_frame() -> None:
    frames = [Frame((1,)), Frame((2, 3)), Frame((4,)), Frame((), True, "error")]
    assert merge_frames(frames) == [Frame((1, 2, 3, 4)), Frame((), True, "error")]
    assert merge_frames([Frame((7,))]) == [Frame((7,))]
    assert merge_frames([Frame((7,), True, "length")]) == [Frame((7,), True, "length")]
    assert merge_frames([]) == []


def test_merge_keeps_a_frame_with_tool_calls_apart_and_whole() -> None:
    call = ToolCall("get_weather", "{}", "call_1")
    frames = [
        Frame((1,)),
        Frame((2,)),
        Frame((3, 4), tool_calls=(call,)),
        Frame((5,)),
        Frame((6,)),
        Frame((7,), True, "tool_call"),
    ]
    # Before the call, its frame, after it, the end: the call keeps its own IDs and no others.
    assert merge_frames(frames) == [
        Frame((1, 2)),
        Frame((3, 4), tool_calls=(call,)),
        Frame((5, 6)),
        Frame((7,), True, "tool_call"),
    ]
