"""A stream's text from its IDs, as the backend would have streamed it.

`TextDecoder`: each ID's bytes from the published map (proxy/core/verify/map_decoder.py, the
bytes a map-driven client renders), concatenated, decoded as UTF-8 incrementally. A character
whose bytes span IDs, or frames, comes out once its last byte is in (codec-spec.md §1.4: "a
frame boundary is never a valid rendering boundary for a partial emoji or multi-byte
character"). Decisions, each what the backends' own detokenizers do with the same IDs:

* Special tokens (end of turn, ...) render as nothing, and are skipped rather than ending the
  bytes before them: Hugging Face's `decode(skip_special_tokens=True)` drops them first, then
  decodes the bytes that are left. (codecai's `Detokenizer` flushes its byte buffer at one, so a
  special token inside a character gives U+FFFD there; no backend samples that.)
* Bytes that are not UTF-8 become U+FFFD, one per maximal invalid subpart (the Unicode
  recommendation, Python's `replace` and Rust's `from_utf8_lossy` in the `tokenizers` decoders).
* At the end, the first bytes of a character that never completed (`max_tokens` cut it) become
  one U+FFFD: llama.cpp's non-streamed answer ends so (`"、ア�"` in
  tests/fixtures/upstream/llamacpp-ground-truth.json), as does `decode` on the same IDs.
  llama.cpp's streamed answer leaves them out, but it never reports their IDs either, so a
  Codec stream from it has none to render.
* An ID the map does not know renders as U+FFFD, like codecai's, breaking any character it
  interrupts. (An ID at or past the map's `vocab_size` never gets here: turn.py ends the stream
  as an error.)

`StopText`: the text cut at the first stop string, as backends cut it (OpenAI's `stop`: the
returned text never holds it). The IDs of a Codec stream may hold a stop string the backend never
sent as text: the model sampled its tokens, and the engines' own Codec streams send every sampled
ID (codec-proxy leaves such IDs out, proxy/core/stream/backend_ids.py; llama.cpp's native
answer shows both, tests/fixtures/upstream/llamacpp-ground-truth.json). The text that could be
the start of one is held back until it is known not to be, as backends hold it back.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Final

from proxy.core.verify.map_decoder import MapDecoder

__all__ = ["REPLACEMENT", "StopText", "TextDecoder"]

REPLACEMENT: Final = "\ufffd"
_REPLACEMENT_BYTES: Final = REPLACEMENT.encode()
# IDs joined at a time: a merged frame may hold millions, and the list of their pieces costs 8
# bytes an ID on top of the text.
_SLICE: Final = 1 << 14


class TextDecoder:
    """One stream's IDs in, its text out: `feed` per frame, `flush` at the end."""

    __slots__ = ("_decoder", "_table", "_utf8")

    def __init__(self, decoder: MapDecoder) -> None:
        self._decoder = decoder
        self._table = decoder.table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, ids: Sequence[int]) -> str:
        """The text these IDs complete (a character still incomplete waits for its end)."""
        if len(ids) > _SLICE:
            return "".join([self._feed(ids[at : at + _SLICE]) for at in range(0, len(ids), _SLICE)])
        return self._feed(ids)

    def _feed(self, ids: Sequence[int]) -> str:
        table = self._table
        try:
            # The usual frame: every ID has bytes. IDs are uint32 (the frame decoder checks),
            # so no negative index wraps; a special token, an unknown ID (None) or one past
            # the table takes the slow path.
            data = b"".join([table[token_id] for token_id in ids])  # type: ignore[misc]
        except (TypeError, IndexError):
            data = b"".join(self._piece(token_id) for token_id in ids)
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The end of the stream: an incomplete character left is one U+FFFD."""
        return self._utf8.decode(b"", final=True)

    def _piece(self, token_id: int) -> bytes:
        piece = self._decoder.piece(token_id)
        return _REPLACEMENT_BYTES if piece is None else piece


class StopText:
    """Text in, the text before the first stop string out (nothing after it)."""

    __slots__ = ("_held", "_matched", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        # The empty string stops nothing (backends ignore it).
        self._stops = tuple(stop for stop in stops if stop)
        self._held = ""
        self._matched = False

    @property
    def matched(self) -> bool:
        """Whether a stop string ended the text."""
        return self._matched

    def feed(self, text: str) -> str:
        if self._matched or not text:
            return ""
        if not self._stops:
            return text
        text = self._held + text
        starts = [start for stop in self._stops if (start := text.find(stop)) >= 0]
        if starts:
            self._matched = True
            self._held = ""
            return text[: min(starts)]
        # Only the longest end of the text that begins a stop string may still become one;
        # nothing before it can (it would have to begin a longer one, or be found above).
        keep = max(_prefix_overlap(text, stop) for stop in self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The end: text held back as the possible start of a stop string was not one."""
        held, self._held = self._held, ""
        return held


def _prefix_overlap(text: str, stop: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `stop`."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0
