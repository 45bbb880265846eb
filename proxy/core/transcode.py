"""One Codec response: upstream SSE bytes in, Codec frames out.

    bytes --SSEDecoder--> events --parse_*_chunk--> deltas --Retokenizer--> IDs --> Frame

The transcoder guarantees the stream's one hard rule (codec-spec.md §2, §12 items 6–9): whatever
the upstream does — finishes, sends an error event, sends garbage, or just stops — exactly one
terminal frame (`done=True`) is produced, it is the last, and nothing follows it. Non-terminal
frames are never empty. Text that was received but not yet final when the upstream failed is
still delivered (in a frame before the terminal one): an error loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.core import finish
from proxy.core.chunks import ChunkDelta, StreamDone, StreamFailure, Usage
from proxy.core.errors import ProxyError
from proxy.core.frames import Frame
from proxy.core.retokenizer import Retokenizer, RetokenizerScheme
from proxy.core.sse import SSEDecoder

ChunkParser = Callable[[str], ChunkDelta | StreamDone | StreamFailure]


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """How a finished stream ended, for logs and metrics."""

    finish_reason: str
    error: str | None
    tokens: int
    usage: Usage | None


class CodecTranscoder:
    """Turns one upstream SSE response into Codec frames. One instance per response."""

    def __init__(
        self,
        scheme: RetokenizerScheme,
        parse_chunk: ChunkParser,
        *,
        max_event_bytes: int = 1 << 20,
    ) -> None:
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._parse = parse_chunk
        self._retokenizer = Retokenizer(scheme)
        # Text deltas of the current read: all events that arrived together are retokenized
        # in one go and leave as one frame. They reached us at the same moment, so nothing
        # waits; and one encode per read instead of per event is most of the CPU saved when
        # the upstream is faster than we read.
        self._texts: list[str] = []
        self._tokens = 0
        self._usage: Usage | None = None
        self._outcome: StreamOutcome | None = None

    @property
    def done(self) -> bool:
        """True once the terminal frame has been produced; later input is ignored."""
        return self._outcome is not None

    @property
    def outcome(self) -> StreamOutcome | None:
        return self._outcome

    @property
    def tokens(self) -> int:
        return self._tokens

    def feed(self, data: bytes) -> list[Frame]:
        """Upstream bytes in; the frames they complete out."""
        if self._outcome is not None:
            return []
        frames: list[Frame] = []
        try:
            for event in self._sse.feed(data):
                if event.data:
                    self._on_chunk(self._parse(event.data), frames)
                    if self.done:
                        return frames
        except ProxyError as exc:
            self._terminate(frames, finish.ERROR, error=exc.message)
            return frames
        ids = self._retokenizer.feed(self._take_texts())
        if ids:
            self._emit(frames, Frame(tuple(ids)))
        return frames

    def end_of_upstream(self) -> list[Frame]:
        """The upstream closed its body. Ends the stream if no finish was seen."""
        frames: list[Frame] = []
        if self._outcome is None:
            self._sse.flush()
            self._terminate(
                frames, finish.ERROR, error="upstream closed the stream before finishing"
            )
        return frames

    def fail(self, error: str) -> list[Frame]:
        """The upstream failed (connection lost, timeout): end the stream with an error frame."""
        frames: list[Frame] = []
        if self._outcome is None:
            self._terminate(frames, finish.ERROR, error=error)
        return frames

    def _on_chunk(
        self, chunk: ChunkDelta | StreamDone | StreamFailure, frames: list[Frame]
    ) -> None:
        if isinstance(chunk, StreamFailure):
            self._terminate(frames, finish.ERROR, error=f"upstream error: {chunk.message}")
            return
        if isinstance(chunk, StreamDone):
            # [DONE] before any finish_reason: the backend did not say why it stopped.
            self._terminate(
                frames, finish.ERROR, error="upstream sent [DONE] without finish_reason"
            )
            return
        if chunk.usage is not None:
            self._usage = chunk.usage
        self._texts.append(chunk.text)
        if chunk.finish_reason is None:
            return
        # The last IDs ride on the terminal frame, as the reference engines do (interop.md §0.4).
        ids = self._retokenizer.feed(self._take_texts()) + self._retokenizer.flush()
        reason = finish.codec_finish_reason(chunk.finish_reason, chunk.stop_reason)
        self._finish(frames, ids, reason, error=None)

    def _terminate(self, frames: list[Frame], reason: str, *, error: str) -> None:
        # Deliver what we hold in its own frame: the terminal error frame stays `ids: []`.
        pending = self._retokenizer.feed(self._take_texts()) + self._retokenizer.flush()
        if pending:
            self._emit(frames, Frame(tuple(pending)))
        self._finish(frames, [], reason, error=error)

    def _finish(
        self, frames: list[Frame], ids: list[int], reason: str, *, error: str | None
    ) -> None:
        self._emit(frames, Frame(tuple(ids), done=True, finish_reason=reason))
        self._outcome = StreamOutcome(reason, error, self._tokens, self._usage)

    def _take_texts(self) -> str:
        text = "".join(self._texts)
        self._texts.clear()
        return text

    def _emit(self, frames: list[Frame], frame: Frame) -> None:
        self._tokens += len(frame.ids)
        frames.append(frame)
