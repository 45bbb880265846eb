"""What a response body is made of: upstream body bytes in, client body bytes out.

Every response the proxy streams from an upstream is one of three kinds, and the edge pumps
them all the same way (proxy/server/data/pump.py): read with the body's `deadline()`, `feed`
what arrived, `on_deadline` when the deadline passed first, `flush` at the upstream's end,
`fail` when the upstream broke; write whatever comes back, and stop reading once `done`.

* `RelayedBody`: the upstream's bytes as they came (pass-through).
* `PolicedJsonBody`: the upstream's SSE with the safety policy applied (codec-spec.md §8).
* `CodecBody`: Codec frames (transcoder and guard), encoded, compressed and flushed on the
  schedule (compression/body_writer.py); exactly one terminal frame, whatever happens. A
  sampled stream is also verified (`verified_codec_body`, proxy/core/verify/): the IDs of the
  frames the guard lets out against the text the transcoder was streamed.

(One more kind lives with the renderer: `RenderedResponseBody`, proxy/core/render/response.py,
a Codec upstream's frames rendered as OpenAI JSON.)

Before the response starts the edge reads until the body is `ready` (its status and headers
can be decided), so a failure up to then is still a clean HTTP error.
"""

from __future__ import annotations

from typing import Protocol

from proxy.core.compression.body_writer import BodyWriter
from proxy.core.guard import StreamGuard
from proxy.core.safety.json_policing import JsonStreamPolicer
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
        # Once per upstream chunk: the helpers `flush` and `fail` use are inlined here.
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
