"""Tool calls on Codec frames: the frame field, and whole calls assembled from streamed deltas.

The frame field is the one the reference engines send (codec-spec.md §2.5, §11 item 8):
msgpack key `tool_calls: [{"name"?, "arguments_json", "id"?}]`, protobuf field 4
`repeated ToolCall` with `ToolCall{optional string name = 1; string arguments_json = 2;
optional string id = 3}`. An OpenAI backend streams each call as deltas
(`choices[0].delta.tool_calls[]`: an `index`, the `id` and `function.name` once, then pieces of
`function.arguments`); a Codec frame carries a call once, whole. A call is whole when a call
with a higher index starts (OpenAI streams parallel calls one after the other) or when the
backend finishes the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.core import protowire
from proxy.core.errors import UpstreamProtocolError

__all__ = [
    "ToolCall",
    "ToolCallAssembler",
    "ToolCallDelta",
    "tool_call_from_map",
    "tool_call_from_protobuf",
    "tool_call_map",
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One complete call, as a frame carries it."""

    name: str | None
    arguments_json: str
    id: str | None = None


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
        return ToolCall(self.name, "".join(self.arguments), self.id)


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

    def finish(self) -> list[ToolCall]:
        """The turn ended with tool calls: every call still open is complete."""
        return self._take(lambda index: True)

    def _take(self, complete: Callable[[int], bool]) -> list[ToolCall]:
        done = sorted(index for index in self._drafts if complete(index))
        calls = [self._drafts.pop(index).call() for index in done]
        self._emitted += len(calls)
        return calls


# --- wire ---------------------------------------------------------------------------------


def tool_call_map(call: ToolCall) -> dict[str, str]:
    """The msgpack map, keys in the engines' order, optional keys only when set."""
    value: dict[str, str] = {}
    if call.name is not None:
        value["name"] = call.name
    value["arguments_json"] = call.arguments_json
    if call.id is not None:
        value["id"] = call.id
    return value


def tool_call_from_map(value: Any, fail: protowire.ErrorFactory) -> ToolCall:
    if type(value) is not dict:
        raise fail("a `tool_calls` entry is not a map", "bad_frame")
    name = value.get("name")
    arguments = value.get("arguments_json", "")
    call_id = value.get("id")
    if name is not None and type(name) is not str:
        raise fail("tool call `name` is neither a str nor nil", "bad_frame")
    if type(arguments) is not str:
        raise fail("tool call `arguments_json` is not a str", "bad_frame")
    if call_id is not None and type(call_id) is not str:
        raise fail("tool call `id` is neither a str nor nil", "bad_frame")
    return ToolCall(name, arguments, call_id)


def tool_call_from_protobuf(data: bytes, fail: protowire.ErrorFactory) -> ToolCall:
    """Read a `ToolCall` submessage (the bytes of one field-4 value)."""
    reader = protowire.WireReader(data, fail, "bad_frame")
    name: str | None = None
    arguments = ""
    call_id: str | None = None
    while not reader.at_end:
        number, wire_type = reader.key()
        if number <= 3 and wire_type != protowire.LEN:
            raise reader.fail(f"protobuf ToolCall field {number} has wire type {wire_type}")
        if number == 1:
            name = reader.text("ToolCall.name")
        elif number == 2:
            arguments = reader.text("ToolCall.arguments_json")
        elif number == 3:
            call_id = reader.text("ToolCall.id")
        else:
            reader.skip(wire_type)
    return ToolCall(name, arguments, call_id)
