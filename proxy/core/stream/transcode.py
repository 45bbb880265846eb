"""One Codec response: upstream SSE bytes in, Codec frames out.

    bytes --SSEDecoder--> events --parse_*_chunk--> deltas --IdSource--> IDs --> Frame

The transcoder guarantees the stream's one hard rule (codec-spec.md §2, §12 items 6–9): whatever
the upstream does — finishes, sends an error event, sends garbage, or just stops — exactly one
terminal frame (`done=True`) is produced, it is the last, and nothing follows it. Non-terminal
frames are never empty. Text that was received but not yet final when the upstream failed is
still delivered (in a frame before the terminal one): an error loses nothing. A fault of the
proxy's own in any stage here ends the stream the same way (`StreamOutcome.internal`), minus
what the ID source held: its state is no longer trusted.

A UTF-16 surrogate pair the upstream cut between two events is rejoined before the text goes
anywhere (proxy/core/stream/surrogates.py); a lone surrogate ends the stream with an error.

IDs come from the text (retokenized) or from the backend (proxy/core/stream/token_source.py); chat
tool calls are assembled from their deltas and ride on the next frame that goes out
(codec-spec.md §2.5: a frame with no IDs may only be the terminal one).

`on_text`, when given, sees each chunk's text as it is handed to the ID source: the text the
stream's IDs must account for, which a sampled stream's verifier compares them with
(proxy/core/verify/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.core.errors import ProxyError, UpstreamProtocolError
from proxy.core.stream.chunks import ChunkDelta, StreamDone, StreamFailure, Usage
from proxy.core.stream.retokenizer import RetokenizerScheme
from proxy.core.stream.sse import SSEDecoder
from proxy.core.stream.surrogates import SurrogatePairs
from proxy.core.stream.token_bytes import TokenBytes
from proxy.core.stream.token_source import (
    BACKEND,
    RETOKENIZED,
    IdSource,
    ReportedIds,
    RetokenizedIds,
    TokenIdMode,
)
from proxy.core.stream.tool_calls import ToolCallAssembler
from proxy.core.wire import finish
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall

ChunkParser = Callable[[str], ChunkDelta | StreamDone | StreamFailure]

# Upstream finish words after which open tool calls are whole (the turn ended normally).
_CALLS_COMPLETE = frozenset({"tool_calls", "function_call", "stop", "eos_token"})


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """How a finished stream ended, for logs and metrics."""

    finish_reason: str
    error: str | None
    tokens: int
    usage: Usage | None
    token_source: str = RETOKENIZED
    retokenized_spans: int = 0
    tool_calls: int = 0
    # The error was a fault of the proxy, not of the upstream.
    internal: bool = False
    # The model the upstream named in its finishing chunk (None: it named none).
    model: str | None = None


class CodecTranscoder:
    """Turns one upstream SSE response into Codec frames. One instance per response."""

    def __init__(
        self,
        scheme: RetokenizerScheme,
        parse_chunk: ChunkParser,
        *,
        max_event_bytes: int = 1 << 20,
        token_ids: TokenIdMode = "retokenize",
        token_bytes: TokenBytes | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        if token_ids != "retokenize" and token_bytes is None:
            raise ValueError(f"token_ids={token_ids!r} needs the tokenizer's TokenBytes")
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._parse = parse_chunk
        self._scheme = scheme
        self._mode = token_ids
        self._token_bytes = token_bytes
        # May be set until the first feed (proxy/core/bodies.py wires a verifier in).
        self.on_text = on_text
        # Decided by the first chunk with output (auto/backend), or at once (retokenize).
        self._source: IdSource | None = (
            RetokenizedIds(scheme) if token_ids == "retokenize" else None
        )
        self._tool_calls = ToolCallAssembler()
        self._pairs = SurrogatePairs()
        self._calls: list[ToolCall] = []  # complete, waiting for a frame to ride on
        self._tokens = 0
        self._usage: Usage | None = None
        self._model: str | None = None
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

    @property
    def token_source(self) -> str | None:
        """`backend` or `retokenized` once known; None while no output has arrived."""
        if self._source is not None:
            return self._source.name
        if self._outcome is not None:
            return self._outcome.token_source
        return None

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
            self._take(frames)
        except ProxyError as exc:
            self._terminate(frames, finish.ERROR, error=exc.message)
        except Exception as exc:  # a fault of ours ends the stream all the same (§2)
            self._terminate(frames, finish.ERROR, error=_internal(exc), internal=True)
        return frames

    def feed_text(self, text: str) -> list[Frame]:
        """What `feed` does with a read whose every event was a plain text chunk (no finish,
        usage, tool calls or surrogates; every character spellable) in a stream whose IDs are
        retokenized: the native step (proxy/core/steady) read the events and hands their text."""
        if self._outcome is not None:
            return []
        frames: list[Frame] = []
        try:
            if text and self._source is not None:
                self._source.add(text, None)
            self._take(frames)
        except ProxyError as exc:
            self._terminate(frames, finish.ERROR, error=exc.message)
        except Exception as exc:
            self._terminate(frames, finish.ERROR, error=_internal(exc), internal=True)
        return frames

    def _take(self, frames: list[Frame]) -> None:
        # Every event of one read leaves in one frame (token_source.py).
        if self._source is not None:
            ids = self._source.take()
            if ids:
                self._emit(frames, Frame(tuple(ids), tool_calls=self._take_calls()))

    def flush(self) -> list[Frame]:
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
        if chunk.model is not None:
            self._model = chunk.model
        if chunk.tool_calls:
            self._add_calls(frames, self._tool_calls.feed(chunk.tool_calls))
        text = self._pairs.feed(chunk.text)
        source = self._source
        if source is None and (text or chunk.token_ids):
            source = self._decide(chunk.token_ids is not None)
            if source is None:
                self._terminate(
                    frames,
                    finish.ERROR,
                    error="token_ids=backend, but the upstream reported no token IDs",
                )
                return
        if source is not None:
            if text and self.on_text is not None:
                self.on_text(text)
            spellable = self._scheme.spellable_prefix(text)
            if spellable < len(text):
                # No IDs render this character: the text before it goes out, then the error
                # frame, rather than other text in silence.
                source.add(text[:spellable], chunk.token_ids)
                raise UpstreamProtocolError(
                    f"the upstream's text has a character the model's vocabulary cannot spell "
                    f"(U+{ord(text[spellable]):04X})",
                    code="untokenizable_text",
                )
            source.add(text, chunk.token_ids)
        if chunk.finish_reason is None:
            return
        self._pairs.flush()
        if chunk.finish_reason in _CALLS_COMPLETE:
            self._add_calls(frames, self._tool_calls.flush())
        reason = finish.codec_finish_reason(chunk.finish_reason, chunk.stop_reason)
        if self._tool_calls.emitted and chunk.finish_reason in _CALLS_COMPLETE:
            reason = finish.TOOL_CALL
        # The last IDs ride on the terminal frame, as the reference engines do (interop.md §0.4).
        self._finish(
            frames, self._drain(tool_call_turn=reason == finish.TOOL_CALL), reason, error=None
        )

    def _add_calls(self, frames: list[Frame], calls: list[ToolCall]) -> None:
        # IDs the text confirmed before these calls completed leave first, in a frame without
        # them: a reader takes the IDs of a frame that carries calls, and of every frame after
        # it, for the tool-call region's markup, not content (proxy/core/render/turn.py). Within
        # one read, the text before a call and the call would otherwise share a frame.
        if not calls:
            return
        source = self._source
        if source is not None:
            ids = source.take()
            if ids:
                self._emit(frames, Frame(tuple(ids), tool_calls=self._take_calls()))
        self._calls += calls

    def _decide(self, has_ids: bool) -> IdSource | None:
        # The first chunk with output decides (token_source.py); `backend` insists on IDs.
        if has_ids and self._token_bytes is not None:
            self._source = ReportedIds(self._scheme, self._token_bytes)
        elif self._mode == "backend":
            return None
        else:
            self._source = RetokenizedIds(self._scheme)
        return self._source

    def _drain(self, *, tool_call_turn: bool = False) -> list[int]:
        source = self._source
        return source.flush(tool_call_turn=tool_call_turn) if source is not None else []

    def _terminate(
        self, frames: list[Frame], reason: str, *, error: str, internal: bool = False
    ) -> None:
        # Deliver what we hold in its own frame: the terminal error frame stays `ids: []`.
        # Tool calls still open were cut off: only whole calls are ever sent.
        if self._outcome is not None:
            return
        pending: list[int] = []
        if not internal:
            try:
                pending = self._drain()
            except ProxyError as exc:
                error = f"{error}; then {exc.message}"
            except Exception as exc:  # as in feed: the stream ends all the same
                error, internal = f"{error}; then {_internal(exc)}", True
        if pending:
            self._emit(frames, Frame(tuple(pending), tool_calls=self._take_calls()))
        self._finish(frames, [], reason, error=error, internal=internal)

    def _finish(
        self,
        frames: list[Frame],
        ids: list[int],
        reason: str,
        *,
        error: str | None,
        internal: bool = False,
    ) -> None:
        source = self._source
        if source is not None:
            name, spans = source.name, source.retokenized_spans
        else:
            name, spans = (BACKEND if self._mode == "backend" else RETOKENIZED), 0
        self._emit(frames, Frame(tuple(ids), True, reason, self._take_calls()))
        self._outcome = StreamOutcome(
            reason,
            error,
            self._tokens,
            self._usage,
            name,
            spans,
            self._tool_calls.emitted,
            internal,
            self._model,
        )

    def _take_calls(self) -> tuple[ToolCall, ...]:
        calls = tuple(self._calls)
        self._calls.clear()
        return calls

    def _emit(self, frames: list[Frame], frame: Frame) -> None:
        self._tokens += len(frame.ids)
        frames.append(frame)


def _internal(exc: Exception) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"
