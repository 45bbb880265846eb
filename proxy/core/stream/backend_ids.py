"""The IDs the backend sampled, checked against the text it streamed; retokenized where short.

With `--token-ids backend|auto` the proxy asks the upstream for its sampled IDs (vLLM
`return_token_ids`, llama.cpp `logprobs`; environment.md "Ground-truth IDs") and streams those,
so a client gets exactly the model's tokens, including the ones retokenizing the text cannot
give back: a non-canonical split, an end-of-turn token that renders as nothing.

They are not taken on trust. Measured on llama.cpp (SmolLM2): when a character's UTF-8 bytes
span several tokens, the chunk that completes it reports only its *last* token; the earlier
byte tokens are never reported. So every chunk's IDs are rendered to bytes (TokenBytes) and
must account for the chunk's text:

* IDs may run *ahead* of the text: vLLM holds back an incomplete UTF-8 character, llama.cpp a
  possible stop string, and special tokens render as nothing. Those IDs wait until later text
  shows their bytes; whatever never renders (a stop string, an incomplete character cut by
  `max_tokens`, a tool-call region a parser consumed) is sent at the end of the stream, in order.
* IDs whose bytes already in the stream disagree with the text (a reasoning/tool parser ate
  them) are stale: they are sent, and the chunk's own IDs are checked alone.
* Text the IDs do *not* account for (the llama.cpp case, or a chunk without IDs) is
  retokenized: everything up to the last whole ID that matches (at a character boundary) keeps
  the backend's IDs, the rest of the chunk's text starts a retokenized span, and the chunk's
  remaining IDs are dropped. The span stays open across chunks without usable IDs and closes
  at the next chunk whose IDs check out, which starts at a model token boundary. A client is
  never sent an ID that contradicts the text.
"""

from __future__ import annotations

from collections import deque

from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme
from proxy.core.stream.token_bytes import TokenBytes

_UTF8_CONTINUATION_MIN, _UTF8_CONTINUATION_MAX = 0x80, 0xBF


class BackendIds:
    """One stream's reconciliation of reported IDs with streamed text."""

    __slots__ = (
        "_ahead",
        "_base",
        "_bytes",
        "_emitted",
        "_fallback",
        "_pending",
        "_scheme",
        "retokenized_spans",
    )

    def __init__(self, scheme: RetokenizerScheme, token_bytes: TokenBytes) -> None:
        self._scheme = scheme
        self._bytes = token_bytes
        # Reported IDs not sent yet, each with the absolute byte offset where it ends; their
        # bytes from `_base` (everything before is confirmed by the text) are in `_ahead`.
        self._pending: deque[tuple[int, int]] = deque()
        self._ahead = bytearray()
        self._base = 0
        self._fallback: Retokenizer | None = None
        self._emitted = 0
        self.retokenized_spans = 0

    def feed(self, text: str, ids: tuple[int, ...] | None) -> list[int]:
        """One chunk's text and reported IDs (None: the chunk reported none); IDs now final."""
        rendered = self._bytes.render(ids) if ids else []
        if rendered is None:  # an ID outside our vocabulary: unusable, as if not reported
            ids, rendered = None, []
        raw = text.encode()
        new = b"".join(rendered)
        out: list[int] = []
        if bytes(self._ahead[: len(raw)]) + new[: max(0, len(raw) - len(self._ahead))] == raw:
            # The IDs so far (and this chunk's) account for the text, maybe running ahead.
            if ids:
                out += self._close_fallback()
            self._append(ids, rendered)
            out += self._confirm(len(raw))
        elif new.startswith(raw):
            # What was ahead never rendered; this chunk's IDs alone account for its text.
            out += self._close_fallback()
            out += [token_id for token_id, _ in self._pending]
            self._reset()
            self._append(ids, rendered)
            out += self._confirm(len(raw))
        else:
            out += self._fall_back(raw, ids or (), rendered)
        self._emitted += len(out)
        return out

    def flush(self) -> list[int]:
        """End of the stream: the retokenized span, then IDs whose text never rendered."""
        out = self._close_fallback() + [token_id for token_id, _ in self._pending]
        self._reset()
        self._emitted += len(out)
        return out

    def _append(self, ids: tuple[int, ...] | None, rendered: list[bytes]) -> None:
        end = self._base + len(self._ahead)
        for token_id, piece in zip(ids or (), rendered, strict=True):
            end += len(piece)
            self._pending.append((token_id, end))
            self._ahead += piece

    def _confirm(self, size: int) -> list[int]:
        del self._ahead[:size]
        self._base += size
        out = []
        pending = self._pending
        while pending and pending[0][1] <= self._base:
            out.append(pending.popleft()[0])
        return out

    def _reset(self) -> None:
        self._pending.clear()
        self._ahead.clear()

    def _fall_back(self, raw: bytes, ids: tuple[int, ...], rendered: list[bytes]) -> list[int]:
        self._append(ids, rendered)
        available = bytes(self._ahead)
        common = 0
        for have, want in zip(available, raw, strict=False):
            if have != want:
                break
            common += 1
        # Keep the reported IDs that end inside the matching prefix, at a character boundary
        # of the text (the retokenized rest must be whole characters).
        keep = 0
        cut = 0
        for index, (_, end) in enumerate(self._pending):
            relative = end - self._base
            if relative > common:
                break
            # A cut at 0 keeps nothing: IDs that render no bytes "match" any text, and this
            # chunk's IDs are already known to be wrong somewhere.
            if relative > 0 and (
                relative == len(raw)
                or not _UTF8_CONTINUATION_MIN <= raw[relative] <= _UTF8_CONTINUATION_MAX
            ):
                keep, cut = index + 1, relative
        out = []
        if keep:
            # Backend IDs again: they follow any retokenized span still open, which ends here.
            out = self._close_fallback() + [self._pending[index][0] for index in range(keep)]
        self._reset()
        self._base += len(raw)
        if self._fallback is None:
            self.retokenized_spans += 1
            at_start = self._emitted + len(out) == 0
            self._fallback = Retokenizer(self._scheme, at_start=at_start)
        return out + self._fallback.feed(raw[cut:].decode())

    def _close_fallback(self) -> list[int]:
        fallback, self._fallback = self._fallback, None
        return fallback.flush() if fallback is not None else []
