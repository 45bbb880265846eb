"""OpenAI stream chunk parsing: real vLLM and llama.cpp captures, then the edges of the grammar."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.chunks import (
    ChunkDelta,
    ChunkResult,
    StreamDone,
    StreamFailure,
    Usage,
    parse_chat_chunk,
    parse_completion_chunk,
)
from proxy.core.stream.sse import SSEDecoder
from proxy.core.stream.tool_calls import ToolCallDelta
from tests.core.conftest import read_capture

Parser = Callable[[str], ChunkResult]
PARSERS = [parse_completion_chunk, parse_chat_chunk]


def completion(choice: dict[str, Any], **top: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "finish_reason": None, **choice}], **top})


def chat(delta: dict[str, Any], **choice: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, **choice}]})


# --- Real captures --------------------------------------------------------------------------

CAPTURED_STREAMS: dict[str, tuple[Parser, str, Usage | None]] = {
    "llamacpp-chat-sample.txt": (parse_chat_chunk, "I'm glad you're", Usage(32, 5, 37)),
    "llamacpp-chat-usage.txt": (
        parse_chat_chunk,
        "Bonjour in French! Bonjour is a beautiful language. It's a language of the French "
        "people, and it's",
        Usage(35, 24, 59),
    ),
    "llamacpp-completions-logprobs.txt": (
        parse_completion_chunk,
        "\n\nParis is a city that has captivated me since I was a child. I've always been "
        "fascinated by its rich",
        Usage(7, 24, 31),
    ),
    "llamacpp-completions-sample-with-headers.txt": (
        parse_completion_chunk,
        " Paris.\n\nThe United States has a population of approximately",
        Usage(5, 12, 17),
    ),
    "llamacpp-completions-sample.txt": (
        parse_completion_chunk,
        ", the city of New Haven was a thriving metropolis, with towering skyscrapers and bustling "
        "streets. But as the years went by, the city began to lose its way",
        Usage(4, 32, 36),
    ),
    "vllm-chat.txt": (
        parse_chat_chunk,
        "Bonjour in French. Bonjour is a beautiful language. I'm here to help you with your "
        "French language skills.",
        Usage(35, 24, 59),
    ),
    "vllm-completions-sample.txt": (
        parse_completion_chunk,
        " Paris.\n\nThe answer is: 201",
        Usage(5, 12, 17),
    ),
    "vllm-completions-stop-sequence.txt": (parse_completion_chunk, " 4, 5,", None),
    "vllm-completions-token-ids.txt": (
        parse_completion_chunk,
        "\n\nParis is a city that has captivated me since I was a child. I've always been "
        "fascinated by art,",
        Usage(7, 24, 31),
    ),
}

# The same prompt and model on both servers; the two runs diverge only in the last tokens.
SAMPLED_IDS_PREFIX = (
    *(198, 198, 38634, 314, 253, 2240, 338, 553, 32525, 549, 1675, 339, 436),
    *(253, 811, 30, 339, 3543, 1811, 719, 19049, 411),
)


def parse_capture(name: str) -> list[ChunkResult]:
    parser = CAPTURED_STREAMS[name][0]
    decoder = SSEDecoder()
    results = [parser(event.data) for event in decoder.feed(read_capture(name).body)]
    decoder.flush()
    assert not decoder.incomplete
    return results


def deltas(results: list[ChunkResult]) -> list[ChunkDelta]:
    assert isinstance(results[-1], StreamDone)
    assert all(isinstance(result, ChunkDelta) for result in results[:-1])
    return [result for result in results if isinstance(result, ChunkDelta)]


@pytest.mark.parametrize("name", sorted(CAPTURED_STREAMS))
def test_capture_text_and_ending(name: str) -> None:
    _, text, usage = CAPTURED_STREAMS[name]
    chunks = deltas(parse_capture(name))
    assert "".join(chunk.text for chunk in chunks) == text
    finish_reasons = [chunk.finish_reason for chunk in chunks if chunk.finish_reason is not None]
    assert finish_reasons == (["stop"] if "stop-sequence" in name else ["length"])
    assert [chunk.usage for chunk in chunks if chunk.usage is not None] == (
        [] if usage is None else [usage]
    )


def test_llamacpp_logprobs_carry_the_sampled_ids() -> None:
    chunks = deltas(parse_capture("llamacpp-completions-logprobs.txt"))
    ids = [token_id for chunk in chunks for token_id in chunk.token_ids or ()]
    assert tuple(ids) == (*SAMPLED_IDS_PREFIX, 624, 3428)
    # One ID per text chunk; the final usage chunk has `logprobs: null`.
    assert [len(chunk.token_ids) for chunk in chunks if chunk.token_ids is not None] == [1] * 24
    assert chunks[-1].token_ids is None


def test_vllm_return_token_ids() -> None:
    chunks = deltas(parse_capture("vllm-completions-token-ids.txt"))
    ids = [token_id for chunk in chunks for token_id in chunk.token_ids or ()]
    assert tuple(ids) == (*SAMPLED_IDS_PREFIX, 984, 28)
    assert chunks[-1] == ChunkDelta("", usage=Usage(7, 24, 31))  # the `choices: []` chunk


def test_vllm_null_token_ids_and_stop_reason() -> None:
    chunks = deltas(parse_capture("vllm-completions-sample.txt"))
    assert {(chunk.token_ids, chunk.stop_reason) for chunk in chunks} == {(None, None)}


def test_vllm_stop_reason_names_the_stop_string() -> None:
    last = deltas(parse_capture("vllm-completions-stop-sequence.txt"))[-1]
    assert last == ChunkDelta("", finish_reason="stop", stop_reason=" 6", model="smollm2")


def test_llamacpp_chat_role_delta_and_usage_chunk() -> None:
    chunks = deltas(parse_capture("llamacpp-chat-usage.txt"))
    assert chunks[0] == ChunkDelta("")  # {"role": "assistant", "content": null}
    # delta {}; the finishing chunk names the model
    assert chunks[-2] == ChunkDelta(
        "", finish_reason="length", model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert chunks[-1] == ChunkDelta("", usage=Usage(35, 24, 59))  # choices []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "llamacpp-error-bad-json.txt",
            StreamFailure(
                "[json.exception.parse_error.101] parse error at line 1, column 12: syntax error "
                "while parsing value - unexpected end of input; expected '[', '{', or a literal",
                400,
                "invalid_request_error",
            ),
        ),
        (
            "vllm-completions-error-n2-binary.txt",
            StreamFailure("n must be 1 when using greedy sampling, got 2.", 400, "BadRequestError"),
        ),
    ],
)
@pytest.mark.parametrize("parser", PARSERS)
def test_upstream_error_shapes(name: str, expected: StreamFailure, parser: Parser) -> None:
    # The same objects arrive inside a stream when generation fails after the 200.
    assert parser(read_capture(name).body.decode()) == expected


@pytest.mark.parametrize("name", ["llamacpp-tokenize.txt", "vllm-tokenize.txt"])
def test_a_json_object_that_is_no_chunk_is_rejected(name: str) -> None:
    with pytest.raises(UpstreamProtocolError, match="choices"):
        parse_completion_chunk(read_capture(name).body.decode())


# --- Sentinel and failures ------------------------------------------------------------------


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("data", ["[DONE]", " [DONE]", "[DONE]\t"])
def test_done_sentinel(parser: Parser, data: str) -> None:
    assert parser(data) == StreamDone()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("overloaded", StreamFailure("overloaded", None, None)),
        ({"message": "boom", "code": "server_busy"}, StreamFailure("boom", "server_busy", None)),
        (
            {"message": "boom", "type": "server_error", "code": 500},
            StreamFailure("boom", 500, "server_error"),
        ),
        (
            {"code": True, "type": 3, "message": ["not", "text"]},
            StreamFailure("upstream reported an error without a message", None, None),
        ),
        (42, StreamFailure("upstream reported an error without a message", None, None)),
    ],
)
def test_in_stream_error_objects(error: Any, expected: StreamFailure) -> None:
    assert parse_completion_chunk(json.dumps({"error": error})) == expected


def test_null_error_member_is_no_failure() -> None:
    assert parse_completion_chunk(completion({"text": "a"}, error=None)) == ChunkDelta("a")


# --- Completions ----------------------------------------------------------------------------


def test_completion_chunk_fields() -> None:
    data = completion(
        {"text": "hi", "finish_reason": "stop", "stop_reason": 128009, "token_ids": [1, 2]},
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )
    assert parse_completion_chunk(data) == ChunkDelta("hi", "stop", 128009, (1, 2), Usage(3, 2, 5))


def test_usage_members_may_be_missing() -> None:
    assert parse_completion_chunk(completion({"text": ""}, usage={})) == ChunkDelta(
        "", usage=Usage(None, None, None)
    )


def test_only_choice_zero_matters() -> None:
    data = json.dumps({"choices": [{"index": 1, "text": "other"}, {"index": 0, "text": "mine"}, 7]})
    assert parse_completion_chunk(data) == ChunkDelta("mine")
    data = json.dumps({"choices": [{"text": "no index"}]})
    assert parse_completion_chunk(data) == ChunkDelta("no index")


@pytest.mark.parametrize(
    "logprobs",
    [
        {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": None},  # vLLM completions
        {"content": [{"token": "a", "logprob": -0.1, "bytes": [97]}]},  # vLLM chat
        {"content": [{"id": 1}, {"token": "b"}]},
        {"content": None},
        [],
    ],
)
def test_logprobs_without_ids_give_no_ids(logprobs: Any) -> None:
    data = completion({"text": "a", "logprobs": logprobs})
    assert parse_completion_chunk(data) == ChunkDelta("a")


def test_empty_logprobs_content_is_zero_ids() -> None:
    data = completion({"text": "", "logprobs": {"content": []}})
    assert parse_completion_chunk(data) == ChunkDelta("", token_ids=())


def test_token_ids_take_precedence_over_logprobs() -> None:
    data = completion({"text": "a", "token_ids": [5], "logprobs": {"content": [{"id": 6}]}})
    assert parse_completion_chunk(data) == ChunkDelta("a", token_ids=(5,))


def test_tool_call_deltas_in_stream_order() -> None:
    # OpenAI's streaming shape, as vLLM sends it: id, type and name on the first delta.
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    piece = {"index": 0, "function": {"arguments": '{"a"'}}
    second = {"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}
    delta = {"content": None, "tool_calls": [first, piece, second]}
    assert parse_chat_chunk(chat(delta)) == ChunkDelta(
        "",
        tool_calls=(
            ToolCallDelta(0, "call_1", "f"),
            ToolCallDelta(0, arguments='{"a"'),
            ToolCallDelta(1, "call_2", "g", "{}"),
        ),
    )
    # Without `index` (one call), without `function` (id only), null arguments.
    bare = {"tool_calls": [{"id": "x"}, {"function": {"name": None, "arguments": None}}]}
    assert parse_chat_chunk(chat(bare)).tool_calls == (  # type: ignore[union-attr]
        ToolCallDelta(0, "x"),
        ToolCallDelta(0),
    )
    assert parse_chat_chunk(chat({"tool_calls": None})) == ChunkDelta("")


def test_completion_chunks_have_no_tool_calls() -> None:
    # Only chat deltas carry tool calls; a completion choice's stray field is not read.
    data = json.dumps({"choices": [{"index": 0, "text": "a", "tool_calls": "x"}]})
    assert parse_completion_chunk(data) == ChunkDelta("a")


# --- Chat -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        ({"role": "assistant", "content": None}, ""),
        ({"role": "assistant", "content": ""}, ""),
        ({}, ""),
        ({"content": "answer"}, "answer"),
        ({"reasoning_content": "think. ", "content": "answer"}, "think. answer"),
        ({"reasoning": "think. ", "content": None}, "think. "),
        # Newer vLLM may send both names with the same text: it is one piece of text.
        ({"reasoning_content": "think", "reasoning": "think", "content": "!"}, "think!"),
        ({"reasoning_content": None, "reasoning": "r"}, "r"),
    ],
)
def test_chat_delta_text(delta: dict[str, Any], text: str) -> None:
    assert parse_chat_chunk(chat(delta)) == ChunkDelta(text)


def test_chat_chunk_without_delta() -> None:
    assert parse_chat_chunk(json.dumps({"choices": [{"index": 0, "finish_reason": "stop"}]})) == (
        ChunkDelta("", "stop")
    )


def test_chat_logprob_ids() -> None:
    data = chat({"content": "ab"}, logprobs={"content": [{"id": 10}, {"id": 11}]})
    assert parse_chat_chunk(data) == ChunkDelta("ab", token_ids=(10, 11))


# --- Protocol errors ------------------------------------------------------------------------

BAD_COMPLETION_CHUNKS = {
    "not json": "data, not json",
    "truncated": '{"choices": [',
    "array": "[1, 2]",
    "string": '"text"',
    "null": "null",
    "no choices": "{}",
    "choices not a list": '{"choices": {"0": {}}}',
    "choice not an object": '{"choices": ["text"]}',
    "only index 1": completion({"text": "x", "index": 1}),
    "index not an int": completion({"text": "x", "index": "0"}),
    "text missing": completion({}),
    "text null": completion({"text": None}),
    "text a number": completion({"text": 1}),
    "finish_reason a number": completion({"text": "", "finish_reason": 1}),
    "stop_reason a bool": completion({"text": "", "stop_reason": True}),
    "stop_reason a list": completion({"text": "", "stop_reason": [" 6"]}),
    "token_ids not a list": completion({"text": "", "token_ids": 5}),
    "negative id": completion({"text": "", "token_ids": [-1]}),
    "float id": completion({"text": "", "token_ids": [1.0]}),
    "bool id": completion({"text": "", "token_ids": [True]}),
    "id over uint32": completion({"text": "", "token_ids": [1 << 32]}),
    "bad logprob id": completion({"text": "", "logprobs": {"content": [{"id": "7"}]}}),
    "usage not an object": completion({"text": ""}, usage=[1]),
    "usage count negative": completion({"text": ""}, usage={"prompt_tokens": -1}),
    "usage count a float": completion({"text": ""}, usage={"total_tokens": 1.5}),
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "huge integer": '{"choices": [], "usage": {"total_tokens": ' + "9" * 5000 + "}}",
}


@pytest.mark.parametrize("data", BAD_COMPLETION_CHUNKS.values(), ids=BAD_COMPLETION_CHUNKS.keys())
def test_malformed_completion_chunk(data: str) -> None:
    with pytest.raises(UpstreamProtocolError) as info:
        parse_completion_chunk(data)
    assert info.value.status_hint == 502
    assert info.value.code == "bad_upstream_chunk"


BAD_CHAT_CHUNKS = {
    "delta not an object": chat("text"),  # type: ignore[arg-type]
    "content a number": chat({"content": 1}),
    "content an object": chat({"content": {"text": "a"}}),
    "reasoning_content a list": chat({"reasoning_content": ["a"]}),
    "reasoning a number": chat({"reasoning": 1}),
    "tool_calls an object": chat({"tool_calls": {"index": 0}}),
    "tool call a string": chat({"tool_calls": ["f"]}),
    "tool call index a string": chat({"tool_calls": [{"index": "0"}]}),
    "tool call index negative": chat({"tool_calls": [{"index": -1}]}),
    "tool call id a number": chat({"tool_calls": [{"index": 0, "id": 5}]}),
    "tool call function a list": chat({"tool_calls": [{"index": 0, "function": []}]}),
    "tool call name a number": chat({"tool_calls": [{"function": {"name": 1}}]}),
    "tool call arguments an object": chat({"tool_calls": [{"function": {"arguments": {}}}]}),
}


@pytest.mark.parametrize("data", BAD_CHAT_CHUNKS.values(), ids=BAD_CHAT_CHUNKS.keys())
def test_malformed_chat_chunk(data: str) -> None:
    with pytest.raises(UpstreamProtocolError):
        parse_chat_chunk(data)


def test_json_errors_are_chained() -> None:
    with pytest.raises(UpstreamProtocolError) as info:
        parse_chat_chunk("{")
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_results_are_frozen() -> None:
    delta = ChunkDelta("a")
    with pytest.raises(FrozenInstanceError):
        delta.text = "b"  # type: ignore[misc]


# --- Fuzz -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
chunk_keys = st.sampled_from(
    ["choices", "usage", "error", "index", "text", "delta", "content", "reasoning_content",
     "reasoning", "finish_reason", "stop_reason", "token_ids", "logprobs", "id", "role"]
)  # fmt: skip
chunk_like = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1 << 33) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(chunk_keys, children, max_size=5)
    ),
    max_leaves=25,
)


def assert_well_typed(result: ChunkResult) -> None:
    if isinstance(result, ChunkDelta):
        assert isinstance(result.text, str)
        assert result.finish_reason is None or isinstance(result.finish_reason, str)
        assert result.token_ids is None or all(
            type(i) is int and 0 <= i < 1 << 32 for i in result.token_ids
        )
    else:
        assert isinstance(result, StreamDone | StreamFailure)


@pytest.mark.parametrize("parser", PARSERS)
@given(value=json_values | chunk_like)
def test_any_json_gives_a_result_or_a_protocol_error(parser: Parser, value: Any) -> None:
    try:
        result = parser(json.dumps(value))
    except UpstreamProtocolError:
        return
    assert_well_typed(result)


@pytest.mark.parametrize("parser", PARSERS)
@given(data=st.text(max_size=60))
def test_any_text_gives_a_result_or_a_protocol_error(parser: Parser, data: str) -> None:
    try:
        result = parser(data)
    except UpstreamProtocolError:
        return
    assert_well_typed(result)


def test_synthetic_tool_call_stream_parses_into_deltas() -> None:
    decoder = SSEDecoder()
    body = read_capture("vllm-chat-tool-calls-synthetic.txt").body
    results = [parse_chat_chunk(event.data) for event in decoder.feed(body)]
    calls = [call for chunk in deltas(results) for call in chunk.tool_calls]
    assert [(c.index, c.id, c.name) for c in calls if c.id] == [
        (0, "chatcmpl-tool-8d1f", "get_weather"),
        (1, "chatcmpl-tool-93ab", "get_time"),
    ]
    arguments = ["".join(c.arguments for c in calls if c.index == i) for i in (0, 1)]
    assert arguments == ['{"city": "Paris"}', '{"tz": "CET"}']
    assert all(chunk.token_ids for chunk in deltas(results)[1:-1])


def test_the_finishing_chunk_names_the_model() -> None:
    # Read once per stream, from the chunk with the finish reason only.
    middle = parse_completion_chunk(
        '{"model": "m-1", "choices": [{"text": "a", "index": 0, "finish_reason": null}]}'
    )
    last = parse_completion_chunk(
        '{"model": "m-1", "choices": [{"text": "", "index": 0, "finish_reason": "length"}]}'
    )
    odd = parse_completion_chunk(
        '{"model": 7, "choices": [{"text": "", "index": 0, "finish_reason": "stop"}]}'
    )
    assert isinstance(middle, ChunkDelta)
    assert isinstance(last, ChunkDelta)
    assert isinstance(odd, ChunkDelta)
    assert (middle.model, last.model, odd.model) == (None, "m-1", None)
