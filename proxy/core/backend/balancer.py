"""Which upstream gets the next request: least outstanding requests among the routable ones.

Pure state, time passed in. Health comes from two sides:

- Active checks: the edge polls each upstream's health path; a 503 "loading model" means not
  ready. This is the backend's own word about itself, and only it can take the last upstream
  out of rotation (and `/readyz` with it).
- Passive observation (outlier detection): `eject_after` consecutive signs that the upstream
  itself is unwell eject it for `eject_seconds`; any other outcome clears the count. An ejected
  upstream comes back when its time is up, and at once if an active check finds it healthy.

What counts is what says the upstream itself is unwell: a connect failure, a timeout, the
gateway statuses 502, 503 and 504 (RFC 9110 §15.6.3-§15.6.5: an upstream of the server failed,
the server is overloaded or down for maintenance, or it gave up waiting), a close without an
answer (a backend that crashed or restarted, whatever made it) and a head that cannot be
relayed. The last two may be one request's doing, so the edge holds them against one upstream
per request, never against every upstream the request could reach. 500 and 501
(§15.6.1-§15.6.2) are the server saying that *this* request met an unexpected condition or
asks for something it does not implement: llama.cpp answers a chat request whose `tools` is
not an array with 500 and `/v1/embeddings` on a server started without `--embeddings` with
501. Counting those would let any client eject a healthy backend by repeating one bad request;
a backend that fails every request with 500 is left to the active check. This is Envoy's
"consecutive gateway failure" detector rather than its "consecutive 5xx" one.

Ejection is capped, as in Envoy's outlier detection (`max_ejection_percent`): at most that share
of the upstreams is ejected at once, and never the last one still in rotation, so passive
observation alone never leaves nothing to route to. And when fewer than `panic_threshold`
percent of the upstreams are in rotation (Envoy's `healthy_panic_threshold`), ejections are
ignored: every upstream that passes its active check takes requests again, since spreading the
load is then better than piling it on the few that are left.
"""

from __future__ import annotations

from dataclasses import dataclass

# RFC 9110 §15.6.3-§15.6.5. Every other status, 500 and 501 included, shows a working server.
GATEWAY_FAILURES = frozenset({502, 503, 504})

# Envoy's defaults are a 50% panic threshold and a 10% ejection cap that still ejects one host,
# even the only one. A model server pool has one to four upstreams: here half of them may sit
# out, and the only one never does.
DEFAULT_MAX_EJECTION_PERCENT = 50
DEFAULT_PANIC_THRESHOLD = 50


def is_gateway_failure(status: int) -> bool:
    """Whether an upstream's answer with `status` counts towards ejecting it."""
    return status in GATEWAY_FAILURES


@dataclass
class UpstreamState:
    """One upstream, as the balancer sees it."""

    url: str
    outstanding: int = 0
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    healthy: bool = True  # the last active check's verdict
    last_error: str | None = None

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def available(self, now: float) -> bool:
        """In rotation: healthy by the active check and not ejected."""
        return self.healthy and not self.ejected(now)


class Balancer:
    def __init__(
        self,
        urls: tuple[str, ...],
        *,
        eject_after: int,
        eject_seconds: float,
        max_ejection_percent: float = DEFAULT_MAX_EJECTION_PERCENT,
        panic_threshold: float = DEFAULT_PANIC_THRESHOLD,
    ) -> None:
        if not urls:
            raise ValueError("at least one upstream is needed")
        self.upstreams = tuple(UpstreamState(url) for url in urls)
        self._eject_after = eject_after
        self._eject_seconds = eject_seconds
        self._max_ejection_percent = max_ejection_percent
        self._panic_threshold = panic_threshold
        self._turn = 0  # breaks ties in turn, so equal loads spread evenly

    def routable(self, now: float) -> tuple[UpstreamState, ...]:
        """The upstreams requests may go to now: those in rotation, or in panic (too few in
        rotation) every upstream that passes its active check. Empty only when none does."""
        healthy = tuple(u for u in self.upstreams if u.healthy)
        in_rotation = tuple(u for u in healthy if not u.ejected(now))
        share = 100 * len(in_rotation) / len(self.upstreams)
        if in_rotation and share >= self._panic_threshold:
            return in_rotation
        return healthy

    def pick(self, now: float, *, exclude: frozenset[str] = frozenset()) -> UpstreamState | None:
        """The routable upstream with the fewest requests in flight, or None."""
        candidates = [u for u in self.routable(now) if u.url not in exclude]
        if not candidates:
            return None
        least = min(u.outstanding for u in candidates)
        tied = [u for u in candidates if u.outstanding == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def any_available(self, now: float) -> bool:
        """Whether `pick` finds an upstream now: passive ejection alone never makes it False."""
        return bool(self.routable(now))

    def succeeded(self, upstream: UpstreamState) -> None:
        upstream.consecutive_failures = 0
        upstream.last_error = None

    def answered(self, upstream: UpstreamState, status: int, now: float) -> bool:
        """The upstream answered with `status`; True when that ejected it."""
        if is_gateway_failure(status):
            return self.failed(upstream, now, f"answered {status}")
        self.succeeded(upstream)
        return False

    def failed(self, upstream: UpstreamState, now: float, error: str) -> bool:
        """Count a sign that the upstream is unwell (a connect failure, a close without an
        answer, a bad head, a timeout, a gateway status); True when it ejected the upstream."""
        upstream.consecutive_failures += 1
        upstream.last_error = error
        if upstream.consecutive_failures < self._eject_after or not self._may_eject(upstream, now):
            # A capped upstream keeps its count: its next failure tries again, and succeeds
            # once another upstream is back in rotation.
            return False
        upstream.ejected_until = now + self._eject_seconds
        upstream.consecutive_failures = 0
        return True

    def _may_eject(self, upstream: UpstreamState, now: float) -> bool:
        others = [u for u in self.upstreams if u is not upstream]
        if not any(u.available(now) for u in others):
            return False  # the last one in rotation stays, whatever it answers
        ejected = 1 + sum(u.ejected(now) for u in others)
        return 100 * ejected <= self._max_ejection_percent * len(self.upstreams)

    def checked(self, upstream: UpstreamState, *, healthy: bool, error: str | None = None) -> None:
        """An active health check's verdict; a healthy one also ends an ejection."""
        upstream.healthy = healthy
        if healthy:
            upstream.ejected_until = 0.0
            upstream.last_error = None
        else:
            upstream.last_error = error
