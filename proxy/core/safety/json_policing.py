"""The safety policy on plain OpenAI JSON responses (streamed SSE or one JSON body).

With a policy enabled, JSON is no longer passed through byte for byte: each choice's text goes
through the same retokenizer and matcher as a Codec stream, and the text a client receives is
what the matcher released. Every other field of a chunk stays as the upstream sent it (chunks
are re-serialized, so spacing may differ). A `stop` ends a stream with one final chunk whose
`finish_reason` is `content_filter` (OpenAI's word for it) and `data: [DONE]`; the edge then
cancels the upstream request. Events that cannot be parsed are dropped, not forwarded: text
that cannot be checked is not released. A UTF-16 surrogate pair the upstream cut between two
events is rejoined before it is checked (proxy/core/stream/surrogates.py); a lone surrogate is
text that cannot be checked or sent, an `UpstreamProtocolError` (the edge then closes the
connection: a truncated JSON body must not look whole).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.errors import UpstreamProtocolError
from proxy.core.safety.matcher import MatchOutput
from proxy.core.safety.stream import PolicedText
from proxy.core.stream.chunks import loads
from proxy.core.stream.sse import SSEDecoder
from proxy.core.stream.surrogates import SurrogatePairs

CONTENT_FILTER = "content_filter"
_DONE = "[DONE]"
_DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class TextField:
    """Where a choice keeps its text: `text` (completions), `delta` or `message.content` (chat)."""

    container: str | None  # None: the text is a key of the choice itself
    key: str

    def get(self, choice: dict[str, Any]) -> str:
        holder = choice if self.container is None else choice.get(self.container)
        value = holder.get(self.key) if isinstance(holder, dict) else None
        return value if isinstance(value, str) else ""

    def put(self, choice: dict[str, Any], text: str) -> None:
        if self.container is None:
            choice[self.key] = text
            return
        holder = choice.get(self.container)
        if not isinstance(holder, dict):
            holder = choice[self.container] = {}
        if text or isinstance(holder.get(self.key), str):
            holder[self.key] = text

    def final_choice(self, index: int, text: str) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        self.put(choice, text)
        choice["finish_reason"] = CONTENT_FILTER
        return choice


COMPLETION_TEXT = TextField(None, "text")
CHAT_DELTA = TextField("delta", "content")
CHAT_MESSAGE = TextField("message", "content")

PolicedTextFactory = Callable[[], PolicedText]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy did to a response, for the edge's log line (never rule contents)."""

    stop: str | None
    redactions: tuple[str, ...]


class JsonStreamPolicer:
    """One SSE response: upstream bytes in, policed SSE bytes out. One per response."""

    def __init__(
        self, make: PolicedTextFactory, field: TextField, *, max_event_bytes: int = 1 << 20
    ) -> None:
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._make = make
        self._field = field
        self._open: dict[int, PolicedText] = {}
        self._pairs: dict[int, SurrogatePairs] = {}
        self._closed: set[int] = set()
        self._template: dict[str, Any] = {}
        self._stop: str | None = None
        self._redactions: list[str] = []
        self.dropped_events = 0

    @property
    def stopped(self) -> str | None:
        """The category whose `stop` rule ended the stream; the upstream must be cancelled."""
        return self._stop

    @property
    def verdict(self) -> Verdict:
        return Verdict(self._stop, tuple(self._redactions))

    def feed(self, data: bytes) -> bytes:
        """Upstream bytes in; the bytes to send on. Raises `EventTooLarge` like the decoder."""
        out: list[bytes] = []
        for event in self._sse.feed(data):
            if self._stop is not None:
                break
            if event.data:
                out.append(self._event(event.data))
        return b"".join(out)

    def flush(self) -> bytes:
        """The upstream closed: release what the open choices still hold (checked first)."""
        if self._stop is not None:
            return b""
        for pairs in self._pairs.values():
            pairs.flush()
        if not self._open:
            return b""
        choices = []
        for index in sorted(self._open):
            released = self._released(index, self._open.pop(index).flush())
            if released.stop is not None:
                return self._final(index, released.text)
            choices.append({"index": index, **self._choice_text(released.text)})
        return _event({**self._template, "choices": choices})

    def _event(self, data: str) -> bytes:
        if data.strip() == _DONE:
            return self.flush() + _DONE_EVENT
        try:
            chunk = loads(data)
        except (ValueError, RecursionError):
            self.dropped_events += 1
            return b""
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not choices:
            # Errors, usage-only chunks: no generated text to police.
            return _event_data(data)
        self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        kept = []
        for choice in choices:
            if not isinstance(choice, dict) or type(choice.get("index", 0)) is not int:
                self.dropped_events += 1
                return b""
            index = choice.get("index", 0)
            if index in self._closed:
                continue  # nothing after a choice's finish is released, text or not
            policed = self._open.get(index)
            if policed is None:
                policed = self._open[index] = self._make()
                self._pairs[index] = SurrogatePairs()
            released = policed.feed(self._pairs[index].feed(self._field.get(choice)))
            if choice.get("finish_reason") is not None:
                self._pairs.pop(index).flush()
                released = released.then(policed.flush())
                del self._open[index]
                self._closed.add(index)
            released = self._released(index, released)
            if released.stop is not None:
                return self._final(index, released.text, chunk)
            self._field.put(choice, released.text)
            kept.append(choice)
        if not kept:
            return b""
        chunk["choices"] = kept
        return _event(chunk)

    def _released(self, index: int, released: MatchOutput) -> MatchOutput:
        self._redactions += released.redactions
        if released.stop is not None:
            self._stop = released.stop
            self._open.pop(index, None)
        return released

    def _final(self, index: int, text: str, chunk: dict[str, Any] | None = None) -> bytes:
        # One last chunk: the clean text before the violation, `content_filter` for every
        # choice still open, then [DONE]. Nothing the upstream sends later is read.
        template = dict(self._template if chunk is None else chunk)
        template.pop("usage", None)
        choices = [self._field.final_choice(index, text)]
        choices += [self._field.final_choice(other, "") for other in sorted(self._open)]
        self._open.clear()
        return _event({**template, "choices": choices}) + _DONE_EVENT

    def _choice_text(self, text: str) -> dict[str, Any]:
        choice: dict[str, Any] = {}
        self._field.put(choice, text)
        return choice


def police_json_body(
    body: bytes, make: PolicedTextFactory, field: TextField
) -> tuple[bytes, Verdict]:
    """A whole (non-streamed) completion body through the policy, each choice on its own.

    `stop` cuts the choice's text before the violation and sets its `finish_reason` to
    `content_filter`. A body that is not a JSON object with a `choices` list cannot be checked
    and is refused (502): unchecked text is never released.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(
            "upstream completion body is not JSON; it cannot be checked against the policy",
            code="unpoliceable_response",
        ) from exc
    choices = document.get("choices") if isinstance(document, dict) else None
    if not isinstance(choices, list):
        raise UpstreamProtocolError(
            "upstream completion body has no choices; it cannot be checked against the policy",
            code="unpoliceable_response",
        )
    stop: str | None = None
    redactions: list[str] = []
    policed_document = copy.copy(document)
    policed_choices = []
    for choice in choices:
        if not isinstance(choice, dict):
            raise UpstreamProtocolError(
                "upstream choice is not an object", code="unpoliceable_response"
            )
        policed = make()
        released = policed.feed(field.get(choice)).then(policed.flush())
        redactions += released.redactions
        replaced = copy.deepcopy(choice)
        field.put(replaced, released.text)
        if released.stop is not None:
            stop = stop or released.stop
            replaced["finish_reason"] = CONTENT_FILTER
        policed_choices.append(replaced)
    policed_document["choices"] = policed_choices
    return orjson.dumps(policed_document), Verdict(stop, tuple(redactions))


def _event(chunk: dict[str, Any]) -> bytes:
    try:
        data = orjson.dumps(chunk)
    except orjson.JSONEncodeError:
        # A lone surrogate in a field not policed (a logprob's token, a tool call's
        # arguments): orjson refuses it, json escapes it as the upstream sent it.
        data = json.dumps(chunk, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"


def _event_data(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"
