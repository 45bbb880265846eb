"""One upstream SSE event's `data` in, one typed result out: the OpenAI streaming chunk grammar.

vLLM and llama.cpp both stream `/v1/completions` and `/v1/chat/completions` as OpenAI chunk
objects, ended by the `[DONE]` sentinel. They differ in details this module absorbs (see
tests/fixtures/upstream/README.md): where sampled token IDs appear, `stop_reason`, the
`choices: []` usage chunk, and chat reasoning text.

Only what the proxy uses is validated, and strictly: a field it reads with the wrong type is an
`UpstreamProtocolError`. Everything else in a chunk (timings, logprob values, ...) is ignored
whatever its shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.tool_calls import ToolCallDelta

__all__ = [
    "ChunkDelta",
    "ChunkResult",
    "StreamDone",
    "StreamFailure",
    "Usage",
    "loads",
    "parse_chat_chunk",
    "parse_completion_chunk",
]

_DONE_SENTINEL = "[DONE]"
# Largest token ID a Codec frame can carry: `ids` are uint32 on both wires (codec-spec.md §1).
_MAX_TOKEN_ID = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None


@dataclass(frozen=True, slots=True)
class ChunkDelta:
    """Choice 0's increment of generated text, and whatever else the chunk said about it.

    `token_ids` are the sampled IDs when the upstream reports them (vLLM `return_token_ids`,
    llama.cpp `logprobs`), else None. `finish_reason` is the upstream's own value.
    `tool_calls` are chat tool-call deltas (`choices[0].delta.tool_calls`), in stream order.
    """

    text: str
    finish_reason: str | None = None
    # vLLM only: the stop string (str) or stop token ID (int) that ended generation; None on
    # EOS or when the upstream does not say.
    stop_reason: str | int | None = None
    token_ids: tuple[int, ...] | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # The chunk's `model` (what the upstream says generated it), read from the finishing
    # chunk only: once per stream, not per token.
    model: str | None = None


@dataclass(frozen=True, slots=True)
class StreamDone:
    """The `data: [DONE]` sentinel: the upstream finished the stream normally."""


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """An `{"error": ...}` object sent inside the stream, after the 200 status went out."""

    message: str
    code: str | int | None
    type: str | None


ChunkResult = ChunkDelta | StreamDone | StreamFailure

_STREAM_DONE = StreamDone()
_UNDESCRIBED_FAILURE = "upstream reported an error without a message"


ChoiceReader = Callable[[dict[str, Any]], tuple[str, tuple[ToolCallDelta, ...]]]


def parse_completion_chunk(data: str) -> ChunkResult:
    """Parse one `/v1/completions` stream event: the delta is `choices[0].text`."""
    return _parse_chunk(data, _completion_delta)


def parse_chat_chunk(data: str) -> ChunkResult:
    """Parse one `/v1/chat/completions` stream event: the delta is `choices[0].delta`."""
    return _parse_chunk(data, _chat_delta)


def loads(data: str) -> Any:
    """One event's JSON. ValueError (or RecursionError) if it is none."""
    # orjson is about 3x faster than json on a typical 250-byte chunk, and this runs once per
    # generated token. It refuses an escaped lone surrogate ("\ud83c") that json accepts and
    # some servers emit when they cut a UTF-16 pair in two (rejoined where that can be done,
    # proxy/core/stream/surrogates.py); json decides those rare cases.
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _parse_chunk(data: str, read_choice: ChoiceReader) -> ChunkResult:
    if data == _DONE_SENTINEL:
        return _STREAM_DONE
    try:
        chunk = loads(data)
    except (ValueError, RecursionError) as exc:
        if data.strip() == _DONE_SENTINEL:
            return _STREAM_DONE
        raise UpstreamProtocolError(
            f"upstream chunk is not valid JSON: {exc}", code="bad_upstream_chunk"
        ) from exc
    if type(chunk) is not dict:
        raise _protocol_error("upstream chunk is not a JSON object")
    error = chunk.get("error")
    if error is not None:
        return _failure(error)

    usage = _usage(chunk.get("usage"))
    choices = chunk.get("choices")
    if type(choices) is not list:
        raise _protocol_error("upstream chunk has no `choices` list")
    if not choices:
        # The include_usage chunk: `choices: []` plus `usage`.
        return ChunkDelta("", usage=usage)
    choice = _first_choice(choices)
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None and type(finish_reason) is not str:
        raise _protocol_error("`finish_reason` is neither a string nor null")
    stop_reason = choice.get("stop_reason")
    if stop_reason is not None and type(stop_reason) not in (str, int):
        raise _protocol_error("`stop_reason` is neither a string, an integer nor null")
    text, tool_calls = read_choice(choice)
    model = chunk.get("model") if finish_reason is not None else None
    return ChunkDelta(
        text,
        finish_reason,
        stop_reason,
        _token_ids(choice),
        usage,
        tool_calls=tool_calls,
        model=model if type(model) is str else None,
    )


_NO_TOOL_CALLS: tuple[ToolCallDelta, ...] = ()


def _completion_delta(choice: dict[str, Any]) -> tuple[str, tuple[ToolCallDelta, ...]]:
    text = choice.get("text")
    if type(text) is not str:
        raise _protocol_error("`choices[0].text` is not a string")
    return text, _NO_TOOL_CALLS


def _chat_delta(choice: dict[str, Any]) -> tuple[str, tuple[ToolCallDelta, ...]]:
    delta = choice.get("delta")
    if delta is None:
        return "", _NO_TOOL_CALLS
    if type(delta) is not dict:
        raise _protocol_error("`choices[0].delta` is not an object")
    # Role-only first deltas carry `content: null`; finish deltas are `{}`.
    content = _optional_text(delta, "content")
    # Reasoning models stream their thinking in a separate field, `reasoning_content`, or
    # `reasoning` in newer vLLM, which may send both with the same text: read only one. Those
    # tokens were generated before the answer tokens of the same chunk.
    reasoning = _optional_text(delta, "reasoning_content") or _optional_text(delta, "reasoning")
    text = reasoning + content if reasoning else content
    calls = delta.get("tool_calls")
    if calls is None:
        return text, _NO_TOOL_CALLS
    if type(calls) is not list:
        raise _protocol_error("`delta.tool_calls` is neither a list nor null")
    return text, tuple(_tool_call_delta(call) for call in calls)


def _tool_call_delta(call: Any) -> ToolCallDelta:
    # OpenAI's streaming shape: {"index", "id"?, "type"?, "function": {"name"?, "arguments"?}}.
    if type(call) is not dict:
        raise _protocol_error("a `delta.tool_calls` entry is not an object")
    # `index` is required by OpenAI; a server that omits it streams a single call.
    index = call.get("index", 0)
    if type(index) is not int or index < 0:
        raise _protocol_error("`tool_calls[].index` is not a non-negative integer")
    call_id = call.get("id")
    if call_id is not None and type(call_id) is not str:
        raise _protocol_error("`tool_calls[].id` is neither a string nor null")
    function = call.get("function")
    if function is None:
        return ToolCallDelta(index, call_id)
    if type(function) is not dict:
        raise _protocol_error("`tool_calls[].function` is not an object")
    name = function.get("name")
    if name is not None and type(name) is not str:
        raise _protocol_error("`tool_calls[].function.name` is neither a string nor null")
    return ToolCallDelta(index, call_id, name, _optional_text(function, "arguments"))


def _optional_text(delta: dict[str, Any], key: str) -> str:
    value = delta.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise _protocol_error(f"`{key}` is neither a string nor null")
    return value


def _first_choice(choices: list[Any]) -> dict[str, Any]:
    # Binary stream formats are rejected for n > 1 before the upstream is called, so only
    # choice 0 exists (codec-spec.md §2, n>1 rejection); its absence means a confused upstream.
    for choice in choices:
        if type(choice) is not dict:
            raise _protocol_error("a `choices` entry is not an object")
        index = choice.get("index", 0)
        if type(index) is not int:
            raise _protocol_error("`choices[].index` is not an integer")
        if index == 0:
            return choice
    raise _protocol_error("upstream chunk has no choice with index 0")


def _token_ids(choice: dict[str, Any]) -> tuple[int, ...] | None:
    # vLLM with `return_token_ids: true`: `choices[0].token_ids`, null otherwise.
    ids = choice.get("token_ids")
    if ids is not None:
        if type(ids) is not list:
            raise _protocol_error("`choices[0].token_ids` is neither a list nor null")
        return _checked_ids(ids)
    # llama.cpp with `logprobs`: one `{"id": ...}` entry per sampled token. vLLM's logprobs
    # entries have no `id`, so then the chunk simply has no IDs.
    logprobs = choice.get("logprobs")
    if type(logprobs) is not dict:
        return None
    content = logprobs.get("content")
    if type(content) is not list:
        return None
    if not all(type(entry) is dict and "id" in entry for entry in content):
        return None
    return _checked_ids([entry["id"] for entry in content])


def _checked_ids(ids: list[Any]) -> tuple[int, ...]:
    for token_id in ids:
        if type(token_id) is not int or not 0 <= token_id <= _MAX_TOKEN_ID:
            raise _protocol_error(f"token ID {token_id!r} is not an unsigned 32-bit integer")
    return tuple(ids)


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    if type(usage) is not dict:
        raise _protocol_error("`usage` is neither an object nor null")
    return Usage(
        _optional_count(usage, "prompt_tokens"),
        _optional_count(usage, "completion_tokens"),
        _optional_count(usage, "total_tokens"),
    )


def _optional_count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise _protocol_error(f"`usage.{key}` is not a non-negative integer")
    return value


def _failure(error: Any) -> StreamFailure:
    # Both servers send `{"error": {"message", "type", "code", ...}}`; some proxies send a bare
    # string. The stream is failing either way, so odd member types are dropped rather than
    # turning the upstream's own error into a protocol error that hides its message.
    if type(error) is str:
        return StreamFailure(error, None, None)
    if type(error) is not dict:
        return StreamFailure(_UNDESCRIBED_FAILURE, None, None)
    message = error.get("message")
    code = error.get("code")
    kind = error.get("type")
    return StreamFailure(
        message if type(message) is str else _UNDESCRIBED_FAILURE,
        code if type(code) in (str, int) else None,
        kind if type(kind) is str else None,
    )


def _protocol_error(message: str) -> UpstreamProtocolError:
    return UpstreamProtocolError(message, code="bad_upstream_chunk")
