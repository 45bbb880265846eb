"""When a compressed Codec stream flushes: a pure policy, with the time passed in.

The trade (interop.md §2.5; docs/COMPRESSION.md): a flush after every frame delivers each
token at once but costs 10-19 B/token, no better than identity; flushing only at the end
compresses well but delivers nothing until generation ends. The policy bounds the delay instead:

- the stream's first frame is flushed at once: time to first token is sacred;
- later frames are flushed when the oldest unflushed one has waited `interval_ms`, so a quiet
  upstream never holds a token back longer than that (the edge arms a timer at `deadline()`);
- or as soon as `max_frames` frames are pending;
- and at the terminal frame.

`interval_ms == 0` or `max_frames <= 1` flushes every frame. Times are seconds on any
monotonic clock (the edge uses the event loop's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.wire.frames import Frame


@dataclass(frozen=True)
class FlushConfig:
    """The policy's two knobs (`--flush-interval-ms`, `--flush-frames`) and frame merging."""

    interval_ms: float
    max_frames: int
    # Frames pending in one flush window leave as one frame (the spec allows any number of IDs
    # per frame, codec-spec.md §2), so the per-frame keys are paid once per window.
    merge: bool = True

    def __post_init__(self) -> None:
        if self.interval_ms < 0:
            raise ValueError("flush interval must be >= 0 ms")
        if self.max_frames < 0:
            raise ValueError("flush frame count must be >= 0")

    @property
    def every_frame(self) -> bool:
        return self.interval_ms == 0 or self.max_frames <= 1


class FlushPolicy:
    """One stream's flush decisions. Call `on_frame` for each frame, `flushed` after a flush."""

    __slots__ = ("_config", "_interval", "_oldest", "_pending", "_started")

    def __init__(self, config: FlushConfig) -> None:
        self._config = config
        self._interval = config.interval_ms / 1000.0
        self._pending = 0
        self._oldest: float | None = None
        self._started = False

    @property
    def pending(self) -> int:
        return self._pending

    def on_frame(self, now: float, *, terminal: bool = False) -> bool:
        """A frame is now pending; True if everything pending must be flushed now."""
        self._pending += 1
        if self._oldest is None:
            self._oldest = now
        first = not self._started
        self._started = True
        return (
            first
            or terminal
            or self._config.every_frame
            or self._pending >= self._config.max_frames
            or now >= self._oldest + self._interval
        )

    def deadline(self) -> float | None:
        """When the pending frames must be flushed at the latest; None if nothing is pending."""
        if self._oldest is None:
            return None
        return self._oldest + self._interval

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def flushed(self) -> None:
        """Everything pending has been handed to the compressor and flushed."""
        self._pending = 0
        self._oldest = None


def merge_frames(frames: Sequence[Frame]) -> list[Frame]:
    """Frames of one flush window as few frames as possible, IDs in order.

    Runs of non-terminal frames without tool calls merge into one. A frame that carries tool
    calls stays as it was made: what its IDs are (the tool-call region's, with backend IDs)
    is told by the frame that carries the calls (proxy/core/render/turn.py), so no IDs from
    before it may join it, and IDs after it stay after its calls. The terminal frame stays as
    the transcoder made it (an error terminal frame is `ids: []` like the engines',
    interop.md §0.4).
    """
    merged: list[Frame] = []
    run: list[Frame] = []
    for frame in frames:
        if frame.done or frame.tool_calls:
            _merge_run(run, merged)
            merged.append(frame)
        else:
            run.append(frame)
    _merge_run(run, merged)
    return merged


def _merge_run(run: list[Frame], merged: list[Frame]) -> None:
    if len(run) == 1:
        merged.append(run[0])
    elif run:
        merged.append(Frame(tuple(token for frame in run for token in frame.ids)))
    run.clear()
