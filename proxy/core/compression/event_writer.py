"""A compressed event stream, sans-IO: whole events in, the bytes to send out, on the schedule.

The byte-stream twin of body_writer.py, for a JSON-SSE response compressed for its client
(proxy/core/http/json_coding.py): the events are the upstream's (or the safety policy's), not
frames, so there is nothing to encode or merge, only the flush schedule (flush.py, the one
Codec streams keep: the first event at once, later ones within the interval, or once
`max_frames` events are pending) and the compressor. The caller cuts the stream at event ends
(proxy/core/stream/sse.py, `EventEnds`): a flush then never leaves the client half an event.
Times are seconds on any monotonic clock (the edge uses the event loop's).
"""

from __future__ import annotations

from proxy.core.compression.compressors import StreamCompressor
from proxy.core.compression.flush import FlushConfig, FlushPolicy


class EventWriter:
    """Compress and flush one stream's events. `flush()` once, at the end."""

    __slots__ = ("_compressor", "_finished", "_policy")

    def __init__(self, compressor: StreamCompressor, config: FlushConfig) -> None:
        self._compressor = compressor
        self._policy = FlushPolicy(config)
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, data: bytes, events: int, now: float) -> bytes:
        """`data` ends where the last of `events` whole events ends (with `events` 0, a piece
        of one, never flushed on its own); the bytes to send now."""
        out = self._compressor.feed(data)
        policy = self._policy
        due = False
        for _ in range(events):
            due |= policy.on_frame(now)
        if due:
            policy.flushed()
            return out + self._compressor.sync()
        return out

    def deadline(self) -> float | None:
        """When pending events must be sent at the latest (`on_deadline`); None if none are."""
        return self._policy.deadline()

    def on_deadline(self, now: float) -> bytes:
        """The deadline has passed with no new event: make what is pending decodable."""
        if not self._policy.due(now):
            return b""
        self._policy.flushed()
        return self._compressor.sync()

    def flush(self) -> bytes:
        """End of input: the end of the compressed stream (it makes everything decodable)."""
        if self._finished:
            return b""
        self._finished = True
        self._policy.flushed()
        return self._compressor.flush()
