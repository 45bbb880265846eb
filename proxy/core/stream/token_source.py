"""Where a stream's token IDs come from: the model's own (reported by the backend) or ours.

`--token-ids` (codec-spec.md §9, "backend token-ID passthrough"):

* `retokenize`: the backend is not asked for IDs; the streamed text is retokenized.
* `backend`: the backend is asked for the IDs it sampled and the stream carries those, checked
  against the text (proxy/core/stream/backend_ids.py retokenizes the spans they do not account
  for or contradict, so the frames decode to the streamed text). A stream whose first output
  carries no IDs ends with an error frame: the operator asked for the model's IDs.
* `auto` (default): asked as for `backend`; per request, the first chunk with output decides:
  backend IDs if it carries IDs, retokenized otherwise.

The choice is reported in the `Codec-Token-Source` response header: `backend` or
`retokenized`. A `backend` stream may contain retokenized spans (the backend under-reported
them or reported IDs the text contradicts; counted in StreamOutcome.retokenized_spans and the
log), since the header is sent before they can be known.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

from proxy.core.stream.backend_ids import BackendIds
from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme
from proxy.core.stream.token_bytes import TokenBytes

TokenIdMode = Literal["auto", "backend", "retokenize"]
TOKEN_ID_MODES: Final[tuple[TokenIdMode, ...]] = ("auto", "backend", "retokenize")

BACKEND: Final = "backend"
RETOKENIZED: Final = "retokenized"


class IdSource(Protocol):
    """One stream's IDs from its chunks. `take()` after each network read, `flush()` once."""

    @property
    def name(self) -> str: ...

    def add(self, text: str, ids: tuple[int, ...] | None) -> None: ...

    def take(self) -> list[int]: ...

    def flush(self, *, tool_call_turn: bool = False) -> list[int]:
        """The end of the stream; `tool_call_turn`: it ended in tool calls."""
        ...

    @property
    def retokenized_spans(self) -> int: ...


class RetokenizedIds:
    """The text, retokenized: all chunks of one read are encoded in one go."""

    name: Final = RETOKENIZED

    def __init__(self, scheme: RetokenizerScheme) -> None:
        self._retokenizer = Retokenizer(scheme)
        # Every event that arrived in one read leaves as one frame: one encode per read is
        # most of the CPU saved when the upstream is faster than we read.
        self._texts: list[str] = []

    def add(self, text: str, ids: tuple[int, ...] | None) -> None:
        if text:
            self._texts.append(text)

    def take(self) -> list[int]:
        text = "".join(self._texts)
        self._texts.clear()
        return self._retokenizer.feed(text)

    def flush(self, *, tool_call_turn: bool = False) -> list[int]:
        return self.take() + self._retokenizer.flush()

    @property
    def retokenized_spans(self) -> int:
        return 0


class ReportedIds:
    """The backend's IDs, checked chunk by chunk against the text."""

    name: Final = BACKEND

    def __init__(self, scheme: RetokenizerScheme, token_bytes: TokenBytes) -> None:
        self._ids = BackendIds(scheme, token_bytes)
        self._out: list[int] = []

    def add(self, text: str, ids: tuple[int, ...] | None) -> None:
        self._out += self._ids.feed(text, ids)

    def take(self) -> list[int]:
        out, self._out = self._out, []
        return out

    def flush(self, *, tool_call_turn: bool = False) -> list[int]:
        return self.take() + self._ids.flush(tool_call_turn=tool_call_turn)

    @property
    def retokenized_spans(self) -> int:
        return self._ids.retokenized_spans
