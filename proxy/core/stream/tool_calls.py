"""Whole tool calls assembled from a chat stream's deltas.

An OpenAI backend streams each call as deltas (`choices[0].delta.tool_calls[]`: an `index`, the
`id` and `function.name` once, then pieces of `function.arguments`); a Codec frame carries a
call once, whole (proxy/core/wire/tool_calls.py). A call is whole when a call with a higher
index starts (OpenAI streams parallel calls one after the other) or when the backend finishes
the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.surrogates import rejoined
from proxy.core.wire.tool_calls import ToolCall

__all__ = ["ToolCallAssembler", "ToolCallDelta"]


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One `choices[0].delta.tool_calls[]` entry: a piece of the call at `index`."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class _Draft:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)

    def call(self) -> ToolCall:
        # Pieces may cut a UTF-16 surrogate pair in two; a whole call has none left.
        name = None if self.name is None else rejoined(self.name)
        call_id = None if self.id is None else rejoined(self.id)
        return ToolCall(name, rejoined("".join(self.arguments)), call_id)


class ToolCallAssembler:
    """One stream's calls in progress. Feed deltas in stream order; get calls once complete."""

    __slots__ = ("_drafts", "_emitted", "_highest")

    def __init__(self) -> None:
        self._drafts: dict[int, _Draft] = {}
        self._highest = -1
        self._emitted = 0  # calls handed out so far

    @property
    def emitted(self) -> int:
        return self._emitted

    @property
    def pending(self) -> bool:
        return bool(self._drafts)

    def feed(self, deltas: tuple[ToolCallDelta, ...]) -> list[ToolCall]:
        """Add one chunk's deltas; return the calls they complete, in index order."""
        for delta in deltas:
            draft = self._drafts.get(delta.index)
            if draft is None:
                if delta.index <= self._highest:
                    # A lower index after a higher one: a call we already sent would change.
                    raise UpstreamProtocolError(
                        f"tool call {delta.index} continued after call {self._highest} started",
                        code="bad_upstream_chunk",
                    )
                draft = self._drafts[delta.index] = _Draft()
                self._highest = delta.index
            # Servers send `id` and `function.name` once, on the call's first delta; some
            # repeat them on later ones. The first value stands.
            if draft.id is None and delta.id:
                draft.id = delta.id
            if draft.name is None and delta.name:
                draft.name = delta.name
            if delta.arguments:
                draft.arguments.append(delta.arguments)
        return self._take(lambda index: index < self._highest)

    def flush(self) -> list[ToolCall]:
        """The turn ended with tool calls: every call still open is complete."""
        return self._take(lambda index: True)

    def _take(self, complete: Callable[[int], bool]) -> list[ToolCall]:
        done = sorted(index for index in self._drafts if complete(index))
        calls = [self._drafts.pop(index).call() for index in done]
        self._emitted += len(calls)
        return calls
