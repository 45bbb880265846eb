"""One stream checked as it is served: the IDs sent, decoded with the map, against the text.

codec-spec.md §12 item 34: a stream's IDs, decoded with the served map, reproduce the text the
backend generated. `StreamVerifier` is fed both sides as they happen, `text()` with each
upstream chunk's text and `ids()` with each frame's IDs as it leaves, and compares them byte for
byte as far as both have come. Either side may run ahead: the retokenizer holds back the last
pre-token, and backends hold back an incomplete UTF-8 character or a possible stop string while
its IDs are already out. Only the side that is ahead is kept, so memory is the unconfirmed part,
never the stream.

Agreement, as the backend-ID check (proxy/core/stream/backend_ids.py) and the promise in
docs/ENDPOINTS.md ("Token IDs") have it:

* special tokens (end of turn, ...) render as nothing, and agree with no text;
* at the end, decoded bytes past the text that are only the first bytes of one UTF-8 character
  agree: `max_tokens` (or a failure) cut the character, and llama.cpp never streams such bytes;
* a turn that ended in tool calls (`tool_call`): the IDs past the text are the tool-call region,
  which the backend streams as calls, not text (codec-spec.md §2.5); they are not compared;
* a metaspace (SentencePiece) map: the decoded text may start with one space more than the
  streamed text, the `▁` SentencePiece prepends to a text (a client that decodes a whole
  SentencePiece text drops it);
* anything else is a mismatch at the first byte where the two differ, as an offset into the
  streamed text's UTF-8.

Two things a map-driven client does make a byte comparison too lenient, so they are checked
apart: an ID the map does not know renders as U+FFFD, which no text matches; and a special token
between the bytes of one character makes the client render those bytes as U+FFFD (codecai's
`Detokenizer` flushes its byte buffer there), so no text may continue past it.

The verdict holds offsets and counts only: log lines carry no text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire import finish

_SPACE = 0x20


@dataclass(frozen=True, slots=True)
class Verification:
    """One verified stream's verdict.

    `first_difference`: byte offset into the streamed text's UTF-8 where the decoded IDs first
    differ (None when they agree). `compared_bytes`: how many bytes of the text the decoded IDs
    matched: all of it when they agree, up to the difference when not.
    """

    agreed: bool
    first_difference: int | None
    compared_bytes: int


class StreamVerifier:
    """Streamed text against decoded IDs, for one stream. `text`/`ids` as they come, `flush`."""

    __slots__ = (
        "_closed",
        "_difference",
        "_ids",
        "_offset",
        "_prefix_open",
        "_special",
        "_stopped",
        "_table",
        "_text",
        "_tolerable",
        "_verdict",
    )

    def __init__(self, decoder: MapDecoder) -> None:
        self._table = decoder.table
        self._special = decoder.special
        # From byte `_offset` on (all before it agreed): the text received beyond the decoded
        # IDs, or the decoded bytes beyond the text. One of the two is empty, except while the
        # SentencePiece prefix is undecided (`_prefix_open`), when nothing is compared yet.
        self._text = bytearray()
        self._ids = bytearray()
        self._offset = 0
        self._prefix_open = decoder.dummy_prefix
        self._difference: int | None = None
        # Nothing more to compare: a difference was found, or the stream ended.
        self._stopped = False
        # The decoded bytes end for good (an unknown ID, or a special token inside a
        # character); `_tolerable`: they may still agree if nothing follows them (a cut
        # character at the end).
        self._closed = False
        self._tolerable = False
        self._verdict: Verification | None = None

    def text(self, delta: str) -> None:
        """The upstream streamed this text (one chunk's worth)."""
        if self._stopped or not delta:
            return
        raw = delta.encode("utf-8", "surrogatepass")
        ids = self._ids
        if ids:
            size = len(raw)
            if len(ids) >= size and not self._prefix_open and ids.startswith(raw):
                # The IDs were ahead and this text confirms the next of them.
                del ids[:size]
                self._offset += size
                return
        elif not (self._prefix_open or self._closed):
            self._text += raw  # the usual case: the text is ahead, the IDs follow
            return
        self._text_arrived(raw)

    def ids(self, ids: Sequence[int]) -> None:
        """These IDs left for the client (one frame's worth, after the guard)."""
        if self._stopped or not ids:
            return
        table = self._table
        try:
            # The usual frame: every ID has bytes. A special token or an unknown ID (None) or
            # an ID past the table sends the frame down the slow path.
            data = b"".join([table[token_id] for token_id in ids])  # type: ignore[misc]
        except (TypeError, IndexError):
            self._ids_one_by_one(ids)
            return
        if self._closed or min(ids) < 0:
            self._ids_one_by_one(ids)
            return
        text = self._text
        size = len(data)
        if len(text) >= size and not self._prefix_open and text.startswith(data):
            # The usual case: the text was ahead and these IDs confirm the next of it.
            del text[:size]
            self._offset += size
            return
        self._decoded(data)

    def flush(self, finish_reason: str | None) -> Verification:
        """The stream ended (`finish_reason` of its terminal frame): the verdict."""
        if self._verdict is not None:
            return self._verdict
        if self._prefix_open:
            self._settle_prefix(final=True)
        if self._difference is None:
            extra = self._ids
            if self._text:
                self._differ(self._offset)  # text the IDs never reached
            elif self._closed and not self._tolerable:
                self._differ(self._offset)  # an unknown ID: U+FFFD past the text
            elif extra and not (finish_reason == finish.TOOL_CALL or _incomplete_character(extra)):
                self._differ(self._offset)
        difference = self._difference
        compared = self._offset if difference is None else difference
        self._verdict = Verification(difference is None, difference, compared)
        self._stopped = True
        self._text.clear()
        self._ids.clear()
        return self._verdict

    # --- the slower paths --------------------------------------------------------------------

    def _text_arrived(self, raw: bytes) -> None:
        if self._prefix_open:
            self._text += raw
            self._settle_prefix(final=False)
            return
        if self._ids:
            rest = self._match(self._ids, raw)
            if rest is None:
                return
            raw = rest
        if raw:
            if self._closed:
                self._differ(self._offset)  # text past the end of what the IDs can render
            else:
                self._text += raw

    def _decoded(self, data: bytes) -> None:
        if not data:
            return
        if self._prefix_open:
            self._ids += data
            self._settle_prefix(final=False)
            return
        if self._text:
            rest = self._match(self._text, data)
            if rest is None:
                return
            data = rest
        self._ids += data

    def _ids_one_by_one(self, ids: Sequence[int]) -> None:
        # The slow path: special tokens, unknown IDs, or the decoded stream already closed.
        table, size, special = self._table, len(self._table), self._special
        pending: list[bytes] = []
        for token_id in ids:
            piece = table[token_id] if 0 <= token_id < size else None
            if self._closed:
                if piece is not None or token_id not in special:
                    self._tolerable = False  # something renders after the cut character
                continue
            if piece is not None:
                pending.append(piece)
                continue
            self._decoded(b"".join(pending))
            pending.clear()
            if self._differs():
                return
            if token_id in special:
                self._special_token()
            else:
                self._unknown_id()
            if self._differs():
                return
        if pending:
            self._decoded(b"".join(pending))

    def _special_token(self) -> None:
        # Renders nothing; but inside a character it breaks that character for the client.
        if self._ids:
            if _ends_inside_character(self._ids):
                self._closed = self._tolerable = True
        elif self._text and _CONTINUATION_MIN <= self._text[0] <= _CONTINUATION_MAX:
            self._differ(self._offset)  # the text goes on with the character's other bytes

    def _unknown_id(self) -> None:
        if self._text and not self._prefix_open:
            self._differ(self._offset)  # U+FFFD where the text has more
        else:
            self._closed, self._tolerable = True, False

    # --- comparing ---------------------------------------------------------------------------

    def _match(self, ahead: bytearray, data: bytes) -> bytes | None:
        """Compare `data` (arriving on one side) with what the other side has `ahead`; consume
        what agrees. The part of `data` beyond `ahead`, or None at a difference."""
        size = min(len(ahead), len(data))
        if ahead.startswith(data if size == len(data) else data[:size]):
            del ahead[:size]
            self._offset += size
            return data[size:] if size < len(data) else b""
        index = 0
        while ahead[index] == data[index]:
            index += 1
        self._differ(self._offset + index)
        return None

    def _differs(self) -> bool:
        return self._difference is not None

    def _differ(self, offset: int) -> None:
        self._difference = offset
        self._stopped = True
        self._text.clear()
        self._ids.clear()

    def _settle_prefix(self, *, final: bool) -> None:
        # SentencePiece's prepended `▁`: the decoded text starts with one space too many iff
        # it starts with more spaces than the streamed text. Decided once both runs of leading
        # spaces are known far enough (or at the end); until then nothing is compared.
        text, decoded = self._text, self._ids
        text_spaces = _leading_spaces(text)
        decoded_spaces = _leading_spaces(decoded)
        text_known = text_spaces < len(text)
        decoded_known = decoded_spaces < len(decoded)
        if not final and not (
            (text_known and len(decoded) > text_spaces)
            or (decoded_known and len(text) >= decoded_spaces)
        ):
            return
        self._prefix_open = False
        if decoded_spaces > text_spaces:
            del decoded[:1]
        if text and decoded:
            rest = self._match(decoded, bytes(text))
            if rest is None:
                return
            text.clear()
            if rest:
                text += rest
        if text and self._closed:
            self._differ(self._offset)


_CONTINUATION_MIN, _CONTINUATION_MAX = 0x80, 0xBF


def _leading_spaces(data: bytearray) -> int:
    count = 0
    for byte in data:
        if byte != _SPACE:
            break
        count += 1
    return count


def _sequence_length(lead: int) -> int:
    """How many bytes the UTF-8 sequence `lead` starts has (0: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def _ends_inside_character(data: bytearray) -> bool:
    """`data` (starting at a character boundary) ends with a character's first bytes only."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if not _CONTINUATION_MIN <= byte <= _CONTINUATION_MAX:
            return _sequence_length(byte) > back
    return False


def _incomplete_character(data: bytearray) -> bool:
    """`data` is the first bytes of one UTF-8 character and no more (a cut character)."""
    size = _sequence_length(data[0])
    return len(data) < size and all(
        _CONTINUATION_MIN <= byte <= _CONTINUATION_MAX for byte in data[1:]
    )
