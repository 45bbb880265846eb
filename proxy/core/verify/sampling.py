"""Which streams are verified, and when mismatches are too many to keep serving Codec.

Both are pure: the random draw and the clock are passed in, so a test decides them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Sampler:
    """Picks a share `rate` of streams: 0 never, 1 always, else `draw() < rate`.

    `draw` returns a float in [0, 1) (`random.random` at the edge); it is not called at 0 or 1,
    so a sampler that is off costs nothing.
    """

    __slots__ = ("_draw", "_rate")

    def __init__(self, rate: float, draw: Callable[[], float]) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample rate {rate!r} is not between 0 and 1")
        self._rate = rate
        self._draw = draw

    @property
    def rate(self) -> float:
        return self._rate

    def pick(self) -> bool:
        rate = self._rate
        if rate <= 0.0:
            return False
        if rate >= 1.0:
            return True
        return self._draw() < rate


class MismatchWindow:
    """Trips when `threshold` mismatches fall within `window_seconds` (threshold 0: never).

    Only the last `threshold` times are kept: the window trips exactly when the oldest of them
    is less than `window_seconds` before the newest.
    """

    __slots__ = ("_threshold", "_times", "_window")

    def __init__(self, threshold: int, window_seconds: float) -> None:
        if threshold < 0:
            raise ValueError(f"mismatch threshold {threshold!r} is negative")
        if not window_seconds > 0:
            raise ValueError(f"mismatch window {window_seconds!r} is not positive")
        self._threshold = threshold
        self._window = window_seconds
        self._times: deque[float] = deque(maxlen=max(threshold, 1))

    @property
    def threshold(self) -> int:
        return self._threshold

    @property
    def window_seconds(self) -> float:
        return self._window

    def record(self, now: float) -> bool:
        """A mismatch at `now` (seconds, any monotonic clock): True if the window trips."""
        if self._threshold == 0:
            return False
        times = self._times
        times.append(now)
        return len(times) == self._threshold and now - times[0] < self._window

    def reset(self) -> None:
        """Forget the mismatches so far (the model was reloaded, or checked clean)."""
        self._times.clear()
