"""The IDs the backend sampled, checked against the streamed text; retokenized where they disagree.

With `--token-ids backend|auto` the proxy asks the upstream for its sampled IDs (vLLM
`return_token_ids`, llama.cpp `logprobs`; environment.md "Ground-truth IDs") and streams those,
so a client gets exactly the model's tokens, including the ones retokenizing the text cannot
give back: a non-canonical split, an end-of-turn token that renders as nothing.

They are not taken on trust. Measured on llama.cpp (SmolLM2): when a character's UTF-8 bytes
span several tokens, the chunk that completes it reports only its *last* token; the earlier
byte tokens are never reported. A backend can also report IDs that are simply wrong. So every
reported ID is rendered to bytes (TokenBytes) and lined up with the text, byte for byte. The
rule: **an ID is sent only where the text confirms it** (its bytes are exactly the streamed
text at that point), **or where no streamed text can contradict it**:

* IDs may run *ahead* of the text: vLLM holds back an incomplete UTF-8 character, llama.cpp a
  possible stop string, and special tokens render as nothing. They wait until later text
  confirms their bytes.
* A chunk's IDs continue the ones still waiting; if the text contradicts those, they start
  where the chunk's text starts instead (the chunk is the unit a backend reports in, so it is
  where IDs and text line up again).
* Waiting IDs the text contradicts are not sent. The text from the last character boundary up
  to which every earlier ID is confirmed is retokenized; so is text that no usable IDs account
  for (the llama.cpp case, a chunk without IDs, IDs outside the vocabulary). Such a span stays
  open over chunks without usable IDs and closes at the next chunk whose own IDs account for
  its text.
* Exception: IDs reported in a chunk *with no text* that later text contradicts before
  confirming any of their bytes stand for text the backend's parser consumed (a tool-call
  region). They are sent where they were reported: the I-D keeps a tool-call region's IDs in
  `ids`.
* At the end of the stream, IDs still ahead of the text are sent only if all they claim past
  the text is the first bytes of one character (`max_tokens` cut it; an end-of-turn token
  claims nothing). Otherwise they are dropped and the text they partly claim is retokenized.
  This holds for IDs reported with no text too: at the end those are a matched stop string,
  which OpenAI's `stop` leaves out of the answer (llama.cpp reports its token in a chunk with
  text `""`, then finishes; so does vLLM), so a Codec client must not read it either. Only a
  turn that ended in tool calls keeps them: they are its tool-call region.

Retokenized spans start and end at character boundaries before which every ID is sent, and
rendered bytes concatenate, so the frames decode to exactly the streamed text across every join
(the IDs at a join may differ from encoding the whole text at once: the text is what is
promised, docs/ENDPOINTS.md "Token IDs").
"""

from __future__ import annotations

from collections import deque

from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme
from proxy.core.stream.token_bytes import TokenBytes

_UTF8_CONTINUATION_MIN, _UTF8_CONTINUATION_MAX = 0x80, 0xBF


class BackendIds:
    """One stream's reconciliation of reported IDs with streamed text."""

    __slots__ = (
        "_base",
        "_bytes",
        "_claimed",
        "_pending",
        "_scheme",
        "_span",
        "_text",
        "retokenized_spans",
    )

    def __init__(self, scheme: RetokenizerScheme, token_bytes: TokenBytes) -> None:
        self._scheme = scheme
        self._bytes = token_bytes
        # Reported IDs not sent yet: (ID, absolute byte offset where its bytes end, whether its
        # chunk had no text).
        self._pending: deque[tuple[int, int, bool]] = deque()
        # From byte offset `_base` on: the bytes the pending IDs render and the text received.
        # The text is always a prefix of the claimed bytes; everything before `_base` is sent
        # (or in the open retokenized span) and `_base` is a character boundary.
        self._claimed = bytearray()
        self._text = bytearray()
        self._base = 0
        # Open while text waits for a chunk whose IDs account for it; then `_pending` is empty.
        self._span: Retokenizer | None = None
        self.retokenized_spans = 0

    @property
    def steady(self) -> bool:
        """Nothing waits: a chunk whose IDs render exactly its text is sent as it is."""
        return self._span is None and not self._pending

    def feed(self, text: str, ids: tuple[int, ...] | None) -> list[int]:
        """One chunk's text and reported IDs (None: the chunk reported none); IDs now final."""
        reported = ids or ()
        rendered = self._bytes.render(reported)
        if rendered is None:  # an ID outside our vocabulary: as if none were reported
            reported, rendered = (), []
        raw = text.encode()
        if self._span is None and not self._pending and b"".join(rendered) == raw:
            # Nothing waits and the IDs are exactly this text: the usual chunk, sent as is.
            self._base += len(raw)
            return list(reported)
        if self._span is None:
            start = len(self._text)
            agreed = _agreement(self._claimed[start : start + len(raw)], raw)
            if agreed < len(self._claimed) - start and agreed < len(raw):
                # This text contradicts what the waiting IDs claim: they get no more text.
                resolved = self._resolve(at_end=False, keep_textless=True)
                return resolved + self._fresh(raw, reported, rendered)
            return self._continue(raw, reported, rendered)
        return self._fresh(raw, reported, rendered)

    def flush(self, *, tool_call_turn: bool = False) -> list[int]:
        """End of the stream: what the IDs still waiting may keep, then any open span.

        `tool_call_turn`: the turn ended in tool calls, so IDs reported with no text that no
        text confirmed are its tool-call region, and are kept."""
        return self._resolve(at_end=True, keep_textless=tool_call_turn) + self._close_span()

    def _continue(self, raw: bytes, ids: tuple[int, ...], rendered: list[bytes]) -> list[int]:
        # The chunk's IDs follow the waiting ones, and its text follows the text.
        start = len(self._text)
        self._claim(ids, rendered, textless=not raw)
        self._text += raw
        agreed = _agreement(self._claimed[start : start + len(raw)], raw)
        if agreed < len(raw):
            return self._fall_back(start + agreed)
        count, cut = self._cut(len(self._text))
        out = self._take(count)
        del self._text[:cut]
        del self._claimed[:cut]
        self._base += cut
        return out

    def _fresh(self, raw: bytes, ids: tuple[int, ...], rendered: list[bytes]) -> list[int]:
        # Nothing waits: the chunk's IDs, if any, start where its text starts. IDs that account
        # for the text (maybe running ahead of it) close the open span; others join it from
        # where they disagree (_fall_back).
        if not ids:
            return self._retokenize(raw)
        out = self._close_span() if b"".join(rendered).startswith(raw) else []
        return out + self._continue(raw, ids, rendered)

    def _fall_back(self, agreed: int) -> list[int]:
        # This chunk's IDs disagree with its text after `agreed` bytes (from `_base`). The ones
        # before keep their place if they end at a character boundary and cover some text: IDs
        # that render no bytes "match" any text, and these are known to be wrong somewhere.
        count, cut = self._cut(agreed, covering=True)
        out = self._close_span() + self._take(count) if count else []
        rest = bytes(self._text[cut:])
        self._base += cut
        self._reset()
        return out + self._retokenize(rest)

    def _resolve(self, *, at_end: bool, keep_textless: bool) -> list[int]:
        # No more text will confirm the waiting IDs: the stream ended, or its next text
        # contradicts them. Sort each by what it claims past the text received.
        text_end = self._base + len(self._text)
        # IDs reported with no text, wholly past the text, kept where they were reported:
        # those that render nothing (an end-of-turn token), and with `keep_textless` all.
        unrendered: list[int] = []
        # Bytes past the text claimed by the other IDs: only the start of a character cut by
        # max_tokens may stand.
        past = bytearray()
        start = self._base
        for token_id, end, textless in self._pending:
            if end > text_end:
                if textless and start >= text_end and (keep_textless or end == start):
                    unrendered.append(token_id)
                else:
                    past += self._claimed[max(start, text_end) - self._base : end - self._base]
            start = end
        if at_end and (not past or _cut_character(past)):
            out = self._take(len(self._pending))
            self._base = text_end
            self._reset()
            return out
        count, cut = self._cut(len(self._text))
        out = self._take(count)
        rest = bytes(self._text[cut:])
        self._base += cut
        self._reset()
        out += self._retokenize(rest)
        if unrendered:
            # Where they were reported: after all the text so far.
            out += self._close_span() + unrendered
        return out

    def _cut(self, limit: int, *, covering: bool = False) -> tuple[int, int]:
        """How many waiting IDs end within `limit` bytes of text at a character boundary, and
        where the last of them ends (relative to `_base`); `covering`: not at `_base` itself."""
        text = self._text
        count = cut = 0
        for index, (_, end, _) in enumerate(self._pending):
            offset = end - self._base
            if offset > limit:
                break
            at_boundary = offset == len(text) or not (
                _UTF8_CONTINUATION_MIN <= text[offset] <= _UTF8_CONTINUATION_MAX
            )
            if at_boundary and (offset or not covering):
                count, cut = index + 1, offset
        return count, cut

    def _claim(self, ids: tuple[int, ...], rendered: list[bytes], *, textless: bool) -> None:
        end = self._base + len(self._claimed)
        for token_id, piece in zip(ids, rendered, strict=True):
            end += len(piece)
            self._pending.append((token_id, end, textless))
            self._claimed += piece

    def _take(self, count: int) -> list[int]:
        pending = self._pending
        return [pending.popleft()[0] for _ in range(count)]

    def _reset(self) -> None:
        # Drops what still waits; `_base` must already say where the text goes on.
        self._pending.clear()
        self._claimed.clear()
        self._text.clear()

    def _retokenize(self, raw: bytes) -> list[int]:
        # Whole characters only: every caller cuts at a character boundary.
        if not raw:
            return []
        if self._span is None:
            self.retokenized_spans += 1
            self._span = Retokenizer(self._scheme, at_start=self._base == 0)
        self._base += len(raw)
        return self._span.feed(raw.decode())

    def _close_span(self) -> list[int]:
        span, self._span = self._span, None
        return span.flush() if span is not None else []


def _agreement(have: bytes | bytearray, want: bytes) -> int:
    """How many leading bytes the two share."""
    size = min(len(have), len(want))
    if have[:size] == want[:size]:
        return size
    index = 0
    while have[index] == want[index]:
        index += 1
    return index


def _cut_character(data: bytearray) -> bool:
    """True if `data` is the start of one UTF-8 character and no more (cut by max_tokens)."""
    lead = data[0]
    if 0xC2 <= lead <= 0xDF:
        size = 2
    elif 0xE0 <= lead <= 0xEF:
        size = 3
    elif 0xF0 <= lead <= 0xF4:
        size = 4
    else:
        return False
    return len(data) < size and all(
        _UTF8_CONTINUATION_MIN <= byte <= _UTF8_CONTINUATION_MAX for byte in data[1:]
    )
