"""One Codec stream's frames in; its text, tool calls and end out, in the order a client sees them.

Within a frame the text comes first, then the calls the frame carries (a call rides on the
next frame that goes out after it completed, proxy/core/stream/transcode.py; the text the
frame's IDs complete was, in every stream seen, generated before the calls). The terminal
frame's IDs are rendered before the end.

The tool-call region: the I-D keeps a tool-call region's own IDs in `ids` (codec-spec.md §2.5),
and codec-proxy does so when the IDs are the backend's (`Codec-Token-Source: backend`). That
markup (`<tool_call>{"name": ...}</tool_call>`, or whatever the model writes) is no content: the
backend's parser consumed it, and an OpenAI client gets the calls instead. Nothing in a frame
marks where the region starts, but codec-proxy holds IDs reported with no text until the end
of the stream (proxy/core/stream/backend_ids.py), and a call completes only once the region
did, so the region's IDs arrive on the frames that carry the calls. So with `backend_ids`, the
IDs of a frame that carries tool calls, and of every frame after it, are not content. Retokenized
streams have no region IDs (the backend never streamed that text) and keep every ID as content.

An ID at or past the map's `vocab_size` proves the server's IDs follow another map than the one
it names: the one kind of map drift a client can see, "a fatal session error" (codec-spec.md
§10). The turn fails there (`TurnEnd.map_drift`), after the text of the frames before; never
replacement characters and a clean end.

The end: a terminal frame's `finish_reason` as OpenAI's word (proxy/core/wire/finish.py), or,
for `error` and words no table knows (the spec says treat them as `error`), a failed turn. A
stop string found in the text (text.py `StopText`) makes the turn `stop`, as the backend
reports it. A body that ends without a terminal frame failed too: codecai ends such a stream
silently (interop.md §0.5), which would hand an OpenAI client a truncated answer as a whole one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.core.render.text import StopText, TextDecoder
from proxy.core.shown import quoted
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire import finish
from proxy.core.wire.frames import Frame
from proxy.core.wire.prompt_ids import outside_vocabulary
from proxy.core.wire.tool_calls import ToolCall

__all__ = ["CONTENT", "Piece", "TextRules", "TurnEnd", "TurnReader"]


@dataclass(frozen=True, slots=True)
class TextRules:
    """How a stream's IDs become its content.

    `stop`: the request's stop strings (empty when it asked for them in the output, vLLM's
    `include_stop_str_in_output`). `backend_ids`: the IDs are the backend's, so a tool-call
    turn's frames carry its markup too (module docstring).
    """

    stop: tuple[str, ...] = ()
    backend_ids: bool = False


# Every ID is content and no text is cut: the rules of a retokenized stream without `stop`.
CONTENT = TextRules()


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How the turn ended: OpenAI's `finish_reason`, or None and why it failed; `map_drift`
    when that was an ID past the map's vocabulary."""

    finish_reason: str | None
    error: str | None = None
    map_drift: bool = False


Piece = str | ToolCall | TurnEnd


class TurnReader:
    """One stream: `feed` its frames as they are decoded, `flush` when its body ends."""

    __slots__ = ("_chat", "_decoder", "_end", "_markup", "_rules", "_stop", "_text", "_tokens")

    def __init__(self, decoder: MapDecoder, *, chat: bool, rules: TextRules = CONTENT) -> None:
        self._decoder = decoder
        self._text = TextDecoder(decoder)
        self._stop = StopText(rules.stop)
        self._rules = rules
        self._chat = chat
        self._markup = False  # the tool-call region has begun (backend IDs only)
        self._tokens = 0
        self._end: TurnEnd | None = None

    @property
    def tokens(self) -> int:
        """IDs received: the completion's token count (`usage.completion_tokens`)."""
        return self._tokens

    @property
    def end(self) -> TurnEnd | None:
        """Set once the turn ended; later frames and failures change nothing."""
        return self._end

    def feed(self, frames: Iterable[Frame]) -> list[Piece]:
        pieces: list[Piece] = []
        for frame in frames:
            if self._end is not None:
                break
            beyond = outside_vocabulary(frame.ids, self._decoder.vocab_size)
            if beyond is not None:
                self._close(pieces, self._drifted(beyond))
                break
            self._tokens += len(frame.ids)
            calls: Sequence[ToolCall] = frame.tool_calls if self._chat else ()
            if calls and self._rules.backend_ids:
                self._markup = True
            if not self._markup:
                _add_text(pieces, self._stop.feed(self._text.feed(frame.ids)))
            pieces += calls
            if frame.done:
                self._finish(pieces, frame.finish_reason)
        return pieces

    def flush(self) -> list[Piece]:
        """The body ended; without a terminal frame, the turn failed."""
        return self.fail("the Codec stream ended before its terminal frame")

    def fail(self, error: str) -> list[Piece]:
        """The stream cannot go on (a transport error, bytes that are no frames)."""
        pieces: list[Piece] = []
        if self._end is None:
            self._close(pieces, TurnEnd(None, error))
        return pieces

    def _drifted(self, token_id: int) -> TurnEnd:
        decoder = self._decoder
        return TurnEnd(
            None,
            f"the Codec stream's token ID {token_id} is past the {decoder.vocab_size} IDs of map "
            f"{decoder.name}: the server's IDs follow another map than the one it names",
            map_drift=True,
        )

    def _finish(self, pieces: list[Piece], reason: str | None) -> None:
        word = finish.openai_finish_reason(reason, chat=self._chat)
        if word is None:
            shown = "none" if reason is None else quoted(reason)
            self._close(pieces, TurnEnd(None, f"the Codec stream ended with finish_reason {shown}"))
            return
        self._close(pieces, TurnEnd(word))

    def _close(self, pieces: list[Piece], end: TurnEnd) -> None:
        if not self._markup:
            _add_text(pieces, self._stop.feed(self._text.flush()))
        _add_text(pieces, self._stop.flush())
        if self._stop.matched and end.finish_reason is not None:
            end = TurnEnd(finish.OPENAI_STOP)
        self._end = end
        pieces.append(end)


def _add_text(pieces: list[Piece], text: str) -> None:
    if not text:
        return
    last = pieces[-1] if pieces else None
    if isinstance(last, str):
        pieces[-1] = last + text
    else:
        pieces.append(text)
