"""Tool calls on Codec frames: the `ToolCall` a frame carries and its two wire encodings.

The frame field is the one the reference engines send (codec-spec.md §2.5, §11 item 8):
msgpack key `tool_calls: [{"name"?, "arguments_json", "id"?}]`, protobuf field 4
`repeated ToolCall` with `ToolCall{optional string name = 1; string arguments_json = 2;
optional string id = 3}`. Calls are assembled from the backend's streamed deltas in
proxy/core/stream/tool_calls.py; a frame carries each call once, whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.wire import protowire

__all__ = ["ToolCall", "tool_call_from_map", "tool_call_from_protobuf", "tool_call_map"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One complete call, as a frame carries it."""

    name: str | None
    arguments_json: str
    id: str | None = None


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
