"""The text served at `GET /codec/schema`: our .proto, cut down to the fields we emit.

codec-spec.md §3.4 recommends serving the v0.5 block "plus `tool_calls` only if the proxy
actually emits it"; a client that compiles the schema should never see a field that cannot
arrive.
"""

from __future__ import annotations

import re

# `repeated ToolCall tool_calls = 4;` with the comment lines right above it.
_TOOL_CALLS_FIELD = re.compile(
    r"(?:^[ \t]*//[^\n]*\n)*^[ \t]*repeated ToolCall tool_calls = 4;\n", re.M
)
# The whole `message ToolCall { ... }` block and the blank line before it.
_TOOL_CALL_MESSAGE = re.compile(r"\n?^message ToolCall \{.*?^\}\n", re.M | re.S)


def served_schema(proto_source: str, *, tool_calls: bool) -> str:
    if tool_calls:
        return proto_source
    return _TOOL_CALL_MESSAGE.sub("", _TOOL_CALLS_FIELD.sub("", proto_source))
