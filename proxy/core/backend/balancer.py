"""Which upstream gets the next request: least outstanding requests among the healthy ones.

Pure state, time passed in. Health comes from two sides: active checks (the edge polls each
upstream's health path; a 503 "loading model" means not ready) and passive observation (N
consecutive connect errors or 5xx answers eject an upstream for a while; one success clears the
count). An ejected upstream comes back on its own when its time is up, and at once if an active
check finds it healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class UpstreamState:
    """One upstream, as the balancer sees it."""

    url: str
    outstanding: int = 0
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    healthy: bool = True  # the last active check's verdict
    last_error: str | None = None

    def available(self, now: float) -> bool:
        return self.healthy and self.ejected_until <= now


class Balancer:
    def __init__(self, urls: tuple[str, ...], *, eject_after: int, eject_seconds: float) -> None:
        if not urls:
            raise ValueError("at least one upstream is needed")
        self.upstreams = tuple(UpstreamState(url) for url in urls)
        self._eject_after = eject_after
        self._eject_seconds = eject_seconds
        self._turn = 0  # breaks ties in turn, so equal loads spread evenly

    def pick(self, now: float, *, exclude: frozenset[str] = frozenset()) -> UpstreamState | None:
        """The available upstream with the fewest requests in flight, or None."""
        candidates = [u for u in self.upstreams if u.url not in exclude and u.available(now)]
        if not candidates:
            return None
        least = min(u.outstanding for u in candidates)
        tied = [u for u in candidates if u.outstanding == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def any_available(self, now: float) -> bool:
        return any(u.available(now) for u in self.upstreams)

    def succeeded(self, upstream: UpstreamState) -> None:
        upstream.consecutive_failures = 0
        upstream.last_error = None

    def failed(self, upstream: UpstreamState, now: float, error: str) -> bool:
        """Count a connect error or 5xx; True when it ejected the upstream."""
        upstream.consecutive_failures += 1
        upstream.last_error = error
        if upstream.consecutive_failures >= self._eject_after:
            upstream.ejected_until = now + self._eject_seconds
            upstream.consecutive_failures = 0
            return True
        return False

    def checked(self, upstream: UpstreamState, *, healthy: bool, error: str | None = None) -> None:
        """An active health check's verdict; a healthy one also ends an ejection."""
        upstream.healthy = healthy
        if healthy:
            upstream.ejected_until = 0.0
            upstream.last_error = None
        else:
            upstream.last_error = error
