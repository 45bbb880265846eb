"""Incremental Server-Sent Events decoder: upstream body bytes in, dispatched events out.

Implements the WHATWG HTML "Interpreting an event stream" algorithm (html.spec.whatwg.org,
§9.2.6): lines end at CRLF, LF or CR; a blank line dispatches; `:` lines are comments; one space
after the colon is stripped; an event without `data` is not dispatched; a leading BOM is
dropped; and an event still open at end of stream is discarded, never dispatched.

Text is decoded as UTF-8 with U+FFFD for invalid sequences, one complete line at a time. CR and
LF never occur inside a multi-byte UTF-8 sequence, so a line is always a whole number of
characters, whatever the network chunking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from proxy.core.errors import EventTooLarge

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "EventEnds", "SSEDecoder", "SSEEvent"]

# A generated-token event is a few hundred bytes; a final llama.cpp chunk with usage and
# timings is under 1 KiB. 1 MiB leaves room for large tool-call arguments while bounding what
# a broken or hostile upstream can make us buffer.
DEFAULT_MAX_EVENT_BYTES = 1 << 20

_BOM = b"\xef\xbb\xbf"
# CRLF before CR: a CR followed by an LF is one line end, not two.
_LINE_END: Final = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. `id` is the last event ID seen so far in the stream, per spec."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Feed body bytes as they arrive; get back every event completed by them.

    The byte budget covers the lines of the event being assembled plus the line being read,
    so it holds whatever the chunking: a line with no terminator cannot grow past it either.
    After `EventTooLarge` the decoder is unusable; the stream has to be abandoned.
    """

    __slots__ = (
        "_at_stream_start",
        "_data",
        "_event_bytes",
        "_event_type",
        "_incomplete",
        "_last_event_id",
        "_max_event_bytes",
        "_partial_line",
        "_skip_lf",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self._max_event_bytes = max_event_bytes
        # The last event ID is not reset between events (WHATWG: "The buffer does not get reset").
        self._last_event_id: str | None = None
        self._incomplete = False
        self._reset_stream()

    def _reset_stream(self) -> None:
        self._at_stream_start = True
        self._partial_line = bytearray()
        # A chunk that ended in CR already ended its line; an LF opening the next chunk is the
        # second half of that CRLF, not an empty line.
        self._skip_lf = False
        self._data: list[str] = []
        self._event_type = ""
        # Bytes of the non-comment lines of the event being assembled.
        self._event_bytes = 0

    @property
    def incomplete(self) -> bool:
        """Whether an unterminated event is pending, or was discarded by the last `flush()`."""
        return self._incomplete or bool(self._partial_line) or self._event_bytes > 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume the next bytes of the body; return the events they complete, in order."""
        self._incomplete = False
        if self._at_stream_start or self._skip_lf:
            data = self._continue_stream(data)
            if self._at_stream_start:
                return []  # still reading what may be a BOM
        if b"\r" in data:
            # Normalising to LF keeps one fast path. Order matters: CRLF first, then lone CR.
            self._skip_lf = data[-1] == 0x0D
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        partial_line = self._partial_line
        last_lf = data.rfind(b"\n")
        if last_lf < 0:
            partial_line += data
            self._check_partial_line()
            return []
        end = last_lf + 1
        if partial_line:
            partial_line += data[:end]
            complete = bytes(partial_line)
            partial_line.clear()
        else:
            complete = data[:end]
        events = self._process_complete_lines(complete)
        if end < len(data):
            partial_line += data[end:]
            self._check_partial_line()
        return events

    def flush(self) -> list[SSEEvent]:
        """Signal end of stream. Never dispatches anything: an unterminated event is discarded.

        `incomplete` then tells whether something was discarded. The decoder is reset, so it
        can read a new stream (a reconnection); the last event ID carries over, as in spec.
        """
        self._incomplete = bool(self._partial_line) or self._event_bytes > 0
        self._reset_stream()
        return []

    def _continue_stream(self, data: bytes) -> bytes:
        if self._at_stream_start:
            # Only a BOM at the very start of the stream is dropped (WHATWG "UTF-8 decode").
            # Until three bytes have arrived a prefix of it may be all there is, so park it.
            head = bytes(self._partial_line) + data
            self._partial_line.clear()
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._partial_line += head
                return b""
            self._at_stream_start = False
            data = head[len(_BOM) :] if head.startswith(_BOM) else head
        if self._skip_lf and data:
            self._skip_lf = False
            if data[0] == 0x0A:
                data = data[1:]
        return data

    def _check_partial_line(self) -> None:
        if self._event_bytes + len(self._partial_line) > self._max_event_bytes:
            raise self._too_large()

    def _too_large(self) -> EventTooLarge:
        return EventTooLarge(
            f"upstream SSE event exceeds {self._max_event_bytes} bytes", code="event_too_large"
        )

    def _process_complete_lines(self, complete: bytes) -> list[SSEEvent]:
        """Interpret LF-terminated lines (`complete` ends with LF)."""
        # Hot path, about one event per generated token. Splitting on the blank-line separator
        # first turns the common event, a single `data: ` line, into one unit handled without
        # the per-line machinery; anything else goes through `_interpret_line`.
        units = complete.split(b"\n\n")
        # After the last separator come zero or more complete lines with no blank line yet.
        tail = units.pop()
        events: list[SSEEvent] = []
        limit = self._max_event_bytes
        for unit in units:
            # A clean state (no field line since the last blank line) is part of the condition:
            # only the first unit can follow lines fed earlier.
            if unit[:6] == b"data: " and b"\n" not in unit and not self._event_bytes:
                if len(unit) > limit:
                    raise self._too_large()
                event = _new_event(SSEEvent)
                _set_data(event, unit[6:].decode("utf-8", "replace"))
                _set_event(event, "message")
                _set_id(event, self._last_event_id)
                events.append(event)
                continue
            for line in unit.split(b"\n"):
                self._interpret_line(line, events)
            self._interpret_line(b"", events)
        if tail:
            for line in tail[:-1].split(b"\n"):
                self._interpret_line(line, events)
        return events

    def _interpret_line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                events.append(
                    SSEEvent(
                        "\n".join(self._data), self._event_type or "message", self._last_event_id
                    )
                )
                self._data = []
            self._event_type = ""
            self._event_bytes = 0
            return
        if self._event_bytes + len(line) > self._max_event_bytes:
            raise self._too_large()
        colon = line.find(b":")
        if colon == 0:
            return  # comment
        self._event_bytes += len(line)
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if name == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            self._event_type = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            self._last_event_id = value.decode("utf-8", "replace")
        # `retry` only tunes reconnection, which the proxy never does; other names are ignored
        # by spec.


# A frozen dataclass's generated __init__ goes through object.__setattr__ once per field:
# ~0.95 µs per event on the CI machine, more than the rest of the per-event work. Setting the
# slots through their member descriptors is the same operation without the name lookups
# (~0.4 µs). Only the hot path uses it; the instances are ordinary frozen SSEEvents.
_new_event = object.__new__
_set_data = vars(SSEEvent)["data"].__set__
_set_event = vars(SSEEvent)["event"].__set__
_set_id = vars(SSEEvent)["id"].__set__


class EventEnds:
    """Where events end in an SSE byte stream, found without decoding it: the blank lines.

    A body that is passed on as it came but cut into pieces (a compressed JSON-SSE response
    is flushed only at event ends, so that a client is never left holding half an event) needs
    only the offsets, with the decoder's idea of a line end: CRLF, LF or CR, across chunks.
    Every blank line counts, including one that dispatches nothing (a comment-only event, or a
    blank line at the start of the stream): each is a point where the client has nothing half
    read.
    """

    __slots__ = ("_after_cr", "_at_line_start")

    def __init__(self) -> None:
        self._at_line_start = True
        # The last byte was a CR: an LF opening the next chunk completes that line end.
        self._after_cr = False

    def feed(self, data: bytes) -> tuple[int, int]:
        """(events, end): how many events `data` ends, and how long the prefix of `data` is
        that ends the last of them (0 when it ends none)."""
        if not data:
            return 0, 0
        if not self._after_cr and b"\r" not in data and b"\n\n\n" not in data:
            # The upstreams' own form, once per event: LF only, no run of blank lines, so the
            # blank lines are the LF pairs (and an LF opening a line), counted without a scan.
            leading = self._at_line_start and data[0] == 0x0A
            events = data.count(b"\n\n") + leading
            last = data.rfind(b"\n\n")
            self._at_line_start = data[-1] == 0x0A
            return events, last + 2 if last >= 0 else int(leading)
        start = 1 if self._after_cr and data[:1] == b"\n" else 0
        self._after_cr = data[-1] == 0x0D
        if start == len(data):
            return 0, 0
        events = end = 0
        # Where the last line end seen ended: a line end starting right there ends a blank line.
        line_start = start if self._at_line_start else -1
        for match in _LINE_END.finditer(data, start):
            if match.start() == line_start:
                events += 1
                end = match.end()
            line_start = match.end()
        self._at_line_start = line_start == len(data)
        return events, end
