"""A Codec stream as the OpenAI JSON an OpenAI client reads: the SSE chunks, or the whole answer.

`SseRenderer` writes what `/v1/completions` and `/v1/chat/completions` stream with
`stream: true`: `text_completion` chunks (`choices[0].text`), or `chat.completion.chunk`s
(`delta.role` first, then `delta.content`, `delta.tool_calls` in OpenAI's streamed shape),
one chunk with the `finish_reason` and an empty text or delta, the usage chunk
(`choices: []`) when `stream_options.include_usage` asked for it, and `data: [DONE]`.
`CompletionRenderer` writes the non-streamed answer (`choices[0].text` / `message`, `usage`).
Both take frames in (`feed`) and give bytes out as soon as they are known, `flush` at the
body's end, `fail` when it cannot go on; no clock, no I/O.

What cannot come back from frames, and what stands in for it (the fields the SDK's types
require are always there, consistently):

* `id`, `created`, `model` are the caller's (`Envelope`): the backend's are not on the wire.
* `usage.prompt_tokens` is 0: frames carry the completion's IDs only; `completion_tokens` counts
  them (a special token such as end-of-turn included, as the backend counts it).
* `logprobs` is null, `system_fingerprint` absent.
* A tool call's `id` is the frame's when it has one (the backend's), else
  `call_<index>_<envelope id>`; a call without a name has `""`.
* A failed stream (a Codec `error`, a finish word no table knows, a body cut before its terminal
  frame) is OpenAI's mid-stream error event, `data: {"error": {...}}`, after the text that came
  before it and before `[DONE]`: vLLM sends that on a failure after the start, and the OpenAI
  SDK raises `APIError` with the message on it. The whole answer of a failed stream is the
  error object alone (`CompletionRenderer.error` says so; the caller picks the status).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from proxy.core.render.turn import CONTENT, Piece, TextRules, TurnEnd, TurnReader
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall

__all__ = ["CompletionRenderer", "Envelope", "SseRenderer"]

Endpoint = Literal["completions", "chat"]

_DONE: Final = b"data: [DONE]\n\n"
ERROR_TYPE: Final = "server_error"
ERROR_CODE: Final = "codec_stream_error"


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every chunk of one answer repeats, and which endpoint's shapes it takes."""

    endpoint: Endpoint
    id: str
    created: int  # Unix seconds, the caller's: the renderer reads no clock
    model: str

    @property
    def chat(self) -> bool:
        return self.endpoint == "chat"


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


# Characters escaped at a time: orjson sets aside about 13 bytes a character for one string, so
# a frame of millions of IDs would cost a quarter of a gigabyte for its text alone.
_ESCAPED_CHARS: Final = 1 << 16


def _json_text(text: str) -> str | orjson.Fragment:
    """`text` as a document holds it: a long one escaped a slice at a time (JSON escapes each
    character on its own, so the slices join to what escaping it whole gives)."""
    if len(text) <= _ESCAPED_CHARS:
        return text
    slices = (text[at : at + _ESCAPED_CHARS] for at in range(0, len(text), _ESCAPED_CHARS))
    return orjson.Fragment(b'"' + b"".join(orjson.dumps(part)[1:-1] for part in slices) + b'"')


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPE, "code": ERROR_CODE}}


def _call_id(envelope: Envelope, call: ToolCall, index: int) -> str:
    return call.id if call.id is not None else f"call_{index}_{envelope.id}"


def _function(call: ToolCall) -> dict[str, str]:
    return {"name": call.name or "", "arguments": call.arguments_json}


class SseRenderer:
    """One streamed answer: frames in, JSON-SSE bytes out."""

    __slots__ = ("_calls_written", "_envelope", "_include_usage", "_started", "_turn")

    def __init__(
        self,
        decoder: MapDecoder,
        envelope: Envelope,
        *,
        rules: TextRules = CONTENT,
        include_usage: bool = False,
    ) -> None:
        self._envelope = envelope
        self._turn = TurnReader(decoder, chat=envelope.chat, rules=rules)
        self._include_usage = include_usage
        self._started = False
        self._calls_written = 0

    @property
    def done(self) -> bool:
        """Whether `[DONE]` has been written: nothing more will be."""
        return self._turn.end is not None

    @property
    def end(self) -> TurnEnd | None:
        """How the turn ended, once it did."""
        return self._turn.end

    @property
    def tokens(self) -> int:
        return self._turn.tokens

    def feed(self, frames: Iterable[Frame]) -> bytes:
        """The chunks these frames complete; a chat's role chunk leads the first bytes out."""
        return self._write(self._turn.feed(frames))

    def flush(self) -> bytes:
        """The body ended: the rest, and an error event if no terminal frame came."""
        return self._write(self._turn.flush())

    def fail(self, message: str) -> bytes:
        """The stream cannot go on: what was rendered is out, then the error event."""
        return self._write(self._turn.fail(message))

    def _write(self, pieces: list[Piece]) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            if self._envelope.chat:
                # OpenAI's first chat chunk names the role; llama.cpp and vLLM send it too.
                out.append(self._chunk({"role": "assistant", "content": ""}))
        for piece in pieces:
            if isinstance(piece, str):
                text = _json_text(piece)
                out.append(self._chunk({"content": text}, text=text))
            elif isinstance(piece, ToolCall):
                out.append(self._tool_call(piece))
            else:
                out += self._end(piece)
        return b"".join(out)

    def _chunk(
        self,
        delta: dict[str, Any],
        *,
        text: str | orjson.Fragment = "",
        finish_reason: str | None = None,
    ) -> bytes:
        envelope = self._envelope
        if envelope.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text}
            kind = "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return _event(
            {
                "id": envelope.id,
                "object": kind,
                "created": envelope.created,
                "model": envelope.model,
                "choices": [choice],
            }
        )

    def _tool_call(self, call: ToolCall) -> bytes:
        # The whole call in one delta: the streamed shape allows a call's name and all of its
        # arguments at once, and the SDK's accumulator concatenates `arguments` either way.
        index = self._calls_written
        self._calls_written += 1
        entry = {
            "index": index,
            "id": _call_id(self._envelope, call, index),
            "type": "function",
            "function": _function(call),
        }
        return self._chunk({"tool_calls": [entry]})

    def _end(self, end: TurnEnd) -> list[bytes]:
        out: list[bytes] = []
        if end.finish_reason is None:
            out.append(_event(_error(end.error or "the Codec stream failed")))
        else:
            out.append(self._chunk({}, finish_reason=end.finish_reason))
            if self._include_usage:
                envelope = self._envelope
                usage: dict[str, Any] = {
                    "id": envelope.id,
                    "object": "chat.completion.chunk" if envelope.chat else "text_completion",
                    "created": envelope.created,
                    "model": envelope.model,
                    "choices": [],
                    "usage": _usage(self._turn.tokens),
                }
                out.append(_event(usage))
        out.append(_DONE)
        return out


class CompletionRenderer:
    """One non-streamed answer: frames in, the whole JSON body out once the turn ended."""

    __slots__ = ("_calls", "_envelope", "_error", "_text", "_turn", "_written")

    def __init__(
        self, decoder: MapDecoder, envelope: Envelope, *, rules: TextRules = CONTENT
    ) -> None:
        self._envelope = envelope
        self._turn = TurnReader(decoder, chat=envelope.chat, rules=rules)
        self._text: list[str] = []
        self._calls: list[ToolCall] = []
        self._error: str | None = None
        self._written = False

    @property
    def done(self) -> bool:
        return self._written

    @property
    def end(self) -> TurnEnd | None:
        return self._turn.end

    @property
    def tokens(self) -> int:
        return self._turn.tokens

    @property
    def error(self) -> str | None:
        """Why the stream failed, once it did: the body is then an OpenAI error object."""
        return self._error

    def feed(self, frames: Iterable[Frame]) -> bytes:
        """b"" until the terminal frame; then the whole body."""
        return self._collect(self._turn.feed(frames))

    def flush(self) -> bytes:
        return self._collect(self._turn.flush())

    def fail(self, message: str) -> bytes:
        return self._collect(self._turn.fail(message))

    def _collect(self, pieces: list[Piece]) -> bytes:
        for piece in pieces:
            if isinstance(piece, str):
                self._text.append(piece)
            elif isinstance(piece, ToolCall):
                self._calls.append(piece)
            else:
                self._written = True
                return self._body(piece)
        return b""

    def _body(self, end: TurnEnd) -> bytes:
        if end.finish_reason is None:
            self._error = end.error or "the Codec stream failed"
            return orjson.dumps(_error(self._error))
        envelope = self._envelope
        text = _json_text("".join(self._text))
        choice: dict[str, Any] = {"index": 0}
        if envelope.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self._calls:
                # OpenAI's shape: no content beside the calls is null, not "".
                message["content"] = text if self._text else None
                message["tool_calls"] = [
                    {
                        "id": _call_id(envelope, call, index),
                        "type": "function",
                        "function": _function(call),
                    }
                    for index, call in enumerate(self._calls)
                ]
            choice["message"] = message
            kind = "chat.completion"
        else:
            choice["text"] = text
            kind = "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = end.finish_reason
        return orjson.dumps(
            {
                "id": envelope.id,
                "object": kind,
                "created": envelope.created,
                "model": envelope.model,
                "choices": [choice],
                "usage": _usage(self._turn.tokens),
            }
        )
