"""What a response body is made of: upstream body bytes in, client body bytes out.

Every response the proxy streams from an upstream is one of three kinds, and the edge pumps
them all the same way (proxy/server/streaming.py): read with the body's `deadline()`, `feed`
what arrived, `on_deadline` when the deadline passed first, `flush` at the upstream's end,
`fail` when the upstream broke; write whatever comes back, and stop reading once `done`.

* `RelayedBody`: the upstream's bytes as they came (pass-through).
* `PolicedJsonBody`: the upstream's SSE with the safety policy applied (codec-spec.md §8).
* `CodecBody`: Codec frames (transcoder and guard), encoded, compressed and flushed on the
  schedule (compression/body_writer.py); exactly one terminal frame, whatever happens.

Before the response starts the edge reads until the body is `ready` (its status and headers
can be decided), so a failure up to then is still a clean HTTP error.
"""

from __future__ import annotations

from typing import Protocol

from proxy.core.compression.body_writer import BodyWriter
from proxy.core.guard import StreamGuard
from proxy.core.safety.json_policing import JsonStreamPolicer


class ResponseBody(Protocol):
    @property
    def ready(self) -> bool:
        """The response can start: enough is known to send its status and headers."""

    @property
    def done(self) -> bool:
        """Nothing more is to be read from the upstream."""

    def feed(self, chunk: bytes, now: float) -> bytes: ...

    def deadline(self) -> float | None:
        """When `on_deadline` must be called if nothing arrives before (None: never)."""

    def on_deadline(self, now: float) -> bytes: ...

    def flush(self, now: float) -> bytes:
        """The upstream's body ended; the rest of the client's body."""

    def fail(self, error: str, now: float) -> bytes | None:
        """The upstream broke mid-body: the bytes that end the body properly, or None when it
        cannot be ended properly (the connection must be closed so the client sees a truncated
        body for what it is)."""


class RelayedBody:
    """Bytes as received: the pass-through relay."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready = False

    @property
    def done(self) -> bool:
        return False

    def feed(self, chunk: bytes, now: float) -> bytes:
        self.ready = True
        return chunk

    def deadline(self) -> float | None:
        return None

    def on_deadline(self, now: float) -> bytes:
        return b""

    def flush(self, now: float) -> bytes:
        self.ready = True
        return b""

    def fail(self, error: str, now: float) -> bytes | None:
        return None


class PolicedJsonBody(RelayedBody):
    """The upstream's SSE, released as the safety policy clears it."""

    __slots__ = ("_policer",)

    def __init__(self, policer: JsonStreamPolicer) -> None:
        super().__init__()
        self._policer = policer

    @property
    def policer(self) -> JsonStreamPolicer:
        return self._policer

    @property
    def done(self) -> bool:
        # A `stop` rule ended the stream: the upstream must be cancelled, not read.
        return self._policer.stopped is not None

    def feed(self, chunk: bytes, now: float) -> bytes:
        self.ready = True
        return self._policer.feed(chunk)

    def flush(self, now: float) -> bytes:
        self.ready = True
        return self._policer.flush()


class CodecBody:
    """Codec frames of the upstream's stream, as this client may receive them."""

    __slots__ = ("_guard", "_started", "_writer")

    def __init__(self, guard: StreamGuard, writer: BodyWriter) -> None:
        self._guard = guard
        self._writer = writer
        self._started = False

    @property
    def guard(self) -> StreamGuard:
        return self._guard

    @property
    def ready(self) -> bool:
        # The first frame is always sent at once, and `Codec-Token-Source` is known by then.
        return self._started or self._guard.done

    @property
    def done(self) -> bool:
        return self._guard.done

    def feed(self, chunk: bytes, now: float) -> bytes:
        return self._sent(self._writer.feed(self._guard.feed(chunk), now))

    def deadline(self) -> float | None:
        return self._writer.deadline()

    def on_deadline(self, now: float) -> bytes:
        return self._writer.on_deadline(now)

    def flush(self, now: float) -> bytes:
        return self._sent(self._writer.feed(self._guard.flush(), now) + self._writer.flush())

    def fail(self, error: str, now: float) -> bytes | None:
        frames = self._guard.fail(error)
        return self._sent(self._writer.feed(frames, now) + self._writer.flush())

    def _sent(self, data: bytes) -> bytes:
        if data:
            self._started = True
        return data
