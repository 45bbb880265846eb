"""What a response body is made of: upstream body bytes in, client body bytes out.

Every response the proxy streams from an upstream is one of these kinds, and the edge pumps
them all the same way (proxy/server/data/stream.py): read with the body's `deadline()`, `feed`
what arrived, `on_deadline` when the deadline passed first, `flush` at the upstream's end,
`fail` when the upstream broke; write whatever comes back, and stop reading once `done`.

* `RelayedBody`: the upstream's bytes as they came (pass-through).
* `PolicedJsonBody`: the upstream's SSE with the safety policy applied (codec-spec.md §8).
* `CodecBody`: Codec frames (transcoder and guard), encoded, compressed and flushed on the
  schedule (compression/body_writer.py); exactly one terminal frame, whatever happens. A
  sampled stream is also verified (`verified_codec_body`, proxy/core/verify/): the IDs of the
  frames the guard lets out against the text the transcoder was streamed.
* `CompressedEventsBody`: a relayed or policed event stream compressed for its client, flushed
  on the same schedule at event ends only; `CompressedWholeBody`: any other JSON body,
  compressed whole (`json_compression`, proxy/core/http/json_coding.py).

(One more kind lives with the renderer: `RenderedResponseBody`, proxy/core/render/response.py,
a Codec upstream's frames rendered as OpenAI JSON.)

Before the response starts the edge reads until the body is `ready` (its status and headers
can be decided), so a failure up to then is still a clean HTTP error.
"""

from __future__ import annotations

from typing import Protocol

from proxy.core.compression.body_writer import BodyWriter
from proxy.core.compression.compressors import StreamCompressor
from proxy.core.compression.event_writer import EventWriter
from proxy.core.guard import StreamGuard
from proxy.core.safety.json_policing import JsonStreamPolicer
from proxy.core.stream.sse import EventEnds
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.verify.verifier import StreamVerifier, Verification
from proxy.core.wire.frames import Frame


class ResponseBody(Protocol):
    # Every chunk comes back as it was fed, and the body ends with the upstream's: the edge
    # may skip `feed` on its steady path (pass-through, the bulk of a relay's traffic).
    passes_through: bool

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

    passes_through = True

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

    passes_through = False

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

    __slots__ = ("_guard", "_started", "_verification", "_verifier", "_writer")

    passes_through = False

    def __init__(
        self, guard: StreamGuard, writer: BodyWriter, verifier: StreamVerifier | None = None
    ) -> None:
        self._guard = guard
        self._writer = writer
        self._started = False
        # Fed the IDs of every frame that goes out; its text comes from the transcoder
        # (`verified_codec_body` wires both).
        self._verifier = verifier
        self._verification: Verification | None = None

    @property
    def guard(self) -> StreamGuard:
        return self._guard

    @property
    def verification(self) -> Verification | None:
        """The verdict once the terminal frame went out; None when the stream was not
        verified, or when the safety policy changed its IDs on purpose (a redaction, a stop)."""
        return self._verification

    @property
    def ready(self) -> bool:
        # The first frame is always sent at once, and `Codec-Token-Source` is known by then.
        return self._started or self._guard.done

    @property
    def done(self) -> bool:
        return self._guard.done

    def feed(self, chunk: bytes, now: float) -> bytes:
        # Once per feed (an upstream read): the helpers `flush` and `fail` use are inlined here.
        frames = self._guard.feed(chunk)
        if self._verifier is not None:
            frames = self._verified(frames)
        data = self._writer.feed(frames, now)
        if data:
            self._started = True
        return data

    def deadline(self) -> float | None:
        return self._writer.deadline()

    def on_deadline(self, now: float) -> bytes:
        return self._writer.on_deadline(now)

    def flush(self, now: float) -> bytes:
        frames = self._verified(self._guard.flush())
        return self._sent(self._writer.feed(frames, now) + self._writer.flush())

    def fail(self, error: str, now: float) -> bytes | None:
        frames = self._verified(self._guard.fail(error))
        return self._sent(self._writer.feed(frames, now) + self._writer.flush())

    def _verified(self, frames: list[Frame]) -> list[Frame]:
        verifier = self._verifier
        if verifier is None:
            return frames
        for frame in frames:
            verifier.ids(frame.ids)
            if frame.done:
                # The one terminal frame ends the stream: its IDs count, nothing after it does.
                self._verifier = None
                verdict = verifier.flush(frame.finish_reason)
                guard = self._guard
                policed = guard.stopped is not None or guard.redactions > 0
                self._verification = None if policed else verdict
                break
        return frames

    def _sent(self, data: bytes) -> bytes:
        if data:
            self._started = True
        return data


def verified_codec_body(
    transcoder: CodecTranscoder,
    guard: StreamGuard,
    writer: BodyWriter,
    decoder: MapDecoder | None,
) -> CodecBody:
    """A Codec body, verified when `decoder` is given (the stream was sampled).

    One `StreamVerifier` hears both sides: the text `transcoder` hands its ID source, and the
    IDs of the frames `guard` (which must wrap `transcoder`) lets out. Call it before the first
    feed. With `decoder` None this is `CodecBody(guard, writer)`, at no cost per frame.
    """
    if decoder is None:
        return CodecBody(guard, writer)
    if guard.source is not transcoder:
        raise ValueError("the guard does not wrap this transcoder")
    if transcoder.on_text is not None:
        raise ValueError("the transcoder's text already goes elsewhere")
    verifier = StreamVerifier(decoder)
    transcoder.on_text = verifier.text
    return CodecBody(guard, writer, verifier)


class CompressedEventsBody:
    """An event stream, relayed or policed (`inner`), compressed for its client: the decoded
    bytes are exactly what `inner` sends, flushed on the schedule (compression/event_writer.py)
    and only at event ends, so a flush never leaves the client half an event."""

    __slots__ = ("_ends", "_held", "_held_bytes", "_inner", "_max_held", "_started", "_writer")

    passes_through = False

    def __init__(self, inner: RelayedBody, writer: EventWriter, *, max_held: int) -> None:
        self._inner = inner
        self._writer = writer
        self._ends = EventEnds()
        # What came after the last event end: compressed with the event it is part of.
        self._held: list[bytes] = []
        self._held_bytes = 0
        # An event longer than this (an upstream that never ends one) is compressed as it
        # comes, unflushed, rather than held without bound.
        self._max_held = max_held
        self._started = False

    @property
    def ready(self) -> bool:
        # The first event is flushed at once: the response starts with it.
        return self._started or self._inner.done

    @property
    def done(self) -> bool:
        return self._inner.done

    def feed(self, chunk: bytes, now: float) -> bytes:
        if self._writer.finished:
            return b""
        data = self._inner.feed(chunk, now)
        out = self._events(data, now) if data else b""
        if self._inner.done:
            # A policy `stop` ended the stream with this chunk: no flush follows.
            out += self._end(now)
        return self._sent(out)

    def deadline(self) -> float | None:
        return self._writer.deadline()

    def on_deadline(self, now: float) -> bytes:
        return self._sent(self._writer.on_deadline(now))

    def flush(self, now: float) -> bytes:
        if self._writer.finished:
            return b""
        data = self._inner.flush(now)
        out = self._events(data, now) if data else b""
        return self._sent(out + self._end(now))

    def fail(self, error: str, now: float) -> bytes | None:
        # A truncated JSON stream must not look whole: not even its compression is ended.
        return None

    def _events(self, data: bytes, now: float) -> bytes:
        events, end = self._ends.feed(data)
        held = self._held
        if not events:
            held.append(data)
            self._held_bytes += len(data)
            if self._held_bytes > self._max_held:
                return self._writer.feed(self._take_held(), 0, now)
            return b""
        whole = data if end == len(data) else data[:end]
        if held:
            whole = b"".join([*held, whole])
            held.clear()
        rest = data[end:]
        self._held_bytes = len(rest)
        if rest:
            held.append(rest)
        return self._writer.feed(whole, events, now)

    def _end(self, now: float) -> bytes:
        # An event the upstream left unended goes out as it came: the bytes are the upstream's.
        return self._writer.feed(self._take_held(), 0, now) + self._writer.flush()

    def _take_held(self) -> bytes:
        held = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        return held

    def _sent(self, data: bytes) -> bytes:
        if data:
            self._started = True
        return data


class CompressedWholeBody:
    """A JSON body compressed whole: sent at the upstream's end, with its `length` known
    for `Content-Length`; or, once its compressed bytes outgrow `max_buffered`, sent on as
    they come (still one compression, never flushed) and without a length."""

    __slots__ = (
        "_buffered",
        "_buffered_bytes",
        "_compressor",
        "_ended",
        "_max_buffered",
        "length",
        "ready",
    )

    passes_through = False

    def __init__(self, compressor: StreamCompressor, *, max_buffered: int) -> None:
        self._compressor = compressor
        self._max_buffered = max_buffered
        self._buffered: list[bytes] = []
        self._buffered_bytes = 0
        self._ended = False
        self.ready = False
        # The whole compressed body's length, once it was compressed before the response began.
        self.length: int | None = None

    @property
    def done(self) -> bool:
        return False

    def feed(self, chunk: bytes, now: float) -> bytes:
        out = self._compressor.feed(chunk)
        if self.ready:
            return out
        if out:
            self._buffered.append(out)
            self._buffered_bytes += len(out)
        if self._buffered_bytes > self._max_buffered:
            self.ready = True
            return self._take_buffered()
        return b""

    def deadline(self) -> float | None:
        return None

    def on_deadline(self, now: float) -> bytes:
        return b""

    def flush(self, now: float) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        end = self._compressor.flush()
        if self.ready:
            return end
        data = self._take_buffered() + end
        self.length = len(data)
        self.ready = True
        return data

    def fail(self, error: str, now: float) -> bytes | None:
        return None

    def _take_buffered(self) -> bytes:
        data = b"".join(self._buffered)
        self._buffered.clear()
        self._buffered_bytes = 0
        return data
