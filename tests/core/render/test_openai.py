"""Codec frames as the OpenAI JSON an OpenAI client reads, checked with the OpenAI SDK's own
types and stream accumulator: captured streams through the proxy's frames read as the
upstream's own chunks do; any frames, in any grouping, end the one way OpenAI streams end."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.chat._types import ParsedChatCompletionSnapshot
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from proxy.core.render import openai as openai_module
from proxy.core.render.openai import CompletionRenderer, Envelope, SseRenderer
from proxy.core.render.text import TextDecoder
from proxy.core.render.turn import CONTENT, TextRules
from proxy.core.stream.token_source import TokenIdMode
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire import finish
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.render.support import (
    STREAM_CAPTURES,
    is_chat,
    source_of,
    transcoded,
    upstream_chunks,
    upstream_finish,
    upstream_text,
)

CHAT = Envelope("chat", "chatcmpl-codec-1", 1_700_000_000, "smollm2")
COMPLETIONS = Envelope("completions", "cmpl-codec-1", 1_700_000_000, "smollm2")
DONE = "[DONE]"


def events(body: bytes) -> list[Any]:
    """The SSE body's events: each `data:` parsed, `[DONE]` as itself. Strict framing."""
    assert body.endswith(b"\n\n")
    out: list[Any] = []
    for event in body[:-2].split(b"\n\n"):
        assert event.startswith(b"data: ")
        assert b"\n" not in event
        data = event.removeprefix(b"data: ")
        out.append(DONE if data == b"[DONE]" else json.loads(data))
    return out


def checked(chunks: list[Any], envelope: Envelope) -> list[Any]:
    """Every chunk as the SDK's types read it, repeating the envelope; `[DONE]` last, once."""
    assert chunks[-1] == DONE
    assert DONE not in chunks[:-1]
    model = ChatCompletionChunk if envelope.chat else Completion
    kind = "chat.completion.chunk" if envelope.chat else "text_completion"
    parsed = []
    for chunk in chunks[:-1]:
        if "error" in chunk:
            parsed.append(chunk)
            continue
        assert (chunk["id"], chunk["created"], chunk["model"], chunk["object"]) == (
            envelope.id,
            envelope.created,
            envelope.model,
            kind,
        )
        assert [choice["index"] for choice in chunk["choices"]] in ([0], [])
        if not envelope.chat and chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
            # The SDK builds streamed completions with its `Completion` type unvalidated
            # (`construct_type`), and that type has no null finish_reason: everything else is
            # validated with one filled in.
            filled = json.loads(json.dumps(chunk))
            filled["choices"][0]["finish_reason"] = "stop"
            Completion.model_validate(filled)
            parsed.append(construct_type(type_=Completion, value=chunk))
            continue
        parsed.append(model.model_validate(chunk))
    return parsed


def text_of(chunks: list[Any]) -> str:
    out = []
    for chunk in chunks:
        if isinstance(chunk, ChatCompletionChunk) and chunk.choices:
            out.append(chunk.choices[0].delta.content or "")
        elif isinstance(chunk, Completion) and chunk.choices:
            out.append(chunk.choices[0].text)
    return "".join(out)


def finish_of(chunks: list[Any]) -> str | None:
    reasons = [
        choice.finish_reason
        for chunk in chunks
        if isinstance(chunk, ChatCompletionChunk | Completion)
        for choice in chunk.choices
        if choice.finish_reason
    ]
    assert len(reasons) <= 1
    return reasons[0] if reasons else None


def accumulated(chunks: list[dict[str, Any]]) -> ParsedChatCompletionSnapshot:
    """The chunks as the SDK's stream helper (`client.chat.completions.stream`) adds them up."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in chunks:
        if chunk.get("choices") or chunk.get("usage"):
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.current_completion_snapshot


def rendered(
    decoder: MapDecoder,
    batches: list[list[Frame]],
    envelope: Envelope,
    *,
    rules: TextRules = CONTENT,
    include_usage: bool = False,
) -> bytes:
    renderer = SseRenderer(decoder, envelope, rules=rules, include_usage=include_usage)
    body = b"".join(renderer.feed(batch) for batch in batches) + renderer.flush()
    assert renderer.done
    assert renderer.flush() == renderer.fail("later") == renderer.feed([Frame((1,))]) == b""
    return body


@pytest.mark.parametrize("name", STREAM_CAPTURES)
@pytest.mark.parametrize("mode", ["auto", "retokenize"])
def test_captured_streams_read_as_the_upstreams_own_chunks(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, name: str, mode: TokenIdMode
) -> None:
    envelope = CHAT if is_chat(name) else COMPLETIONS
    rules = TextRules(backend_ids=source_of(smollm2_vocabulary, name, mode) == "backend")
    batches = transcoded(smollm2_vocabulary, name, mode)
    chunks = checked(events(rendered(smollm2_map, batches, envelope, rules=rules)), envelope)
    assert text_of(chunks) == upstream_text(name)
    assert finish_of(chunks) == upstream_finish(name)
    if not envelope.chat:
        return
    first = chunks[0].choices[0]
    assert (first.delta.role, first.delta.content, first.finish_reason) == ("assistant", "", None)
    ours = accumulated([c.model_dump() for c in chunks]).choices[0]
    theirs = accumulated(upstream_chunks(name)).choices[0]
    reasoning = getattr(theirs.message, "reasoning_content", None) or ""
    assert ours.message.content == reasoning + (theirs.message.content or "")
    assert ours.finish_reason == theirs.finish_reason
    assert [
        (c.id, c.function.name, c.function.arguments) for c in ours.message.tool_calls or []
    ] == [(c.id, c.function.name, c.function.arguments) for c in theirs.message.tool_calls or []]


@st.composite
def frame_streams(draw: st.DrawFn, decoder: MapDecoder) -> list[list[Frame]]:
    """Frames of any IDs (characters split across them, special tokens), grouped into reads,
    the last ending with any word."""
    one_id = st.integers(0, decoder.size - 1) | st.sampled_from(sorted(decoder.special))
    ids = draw(st.lists(st.lists(one_id, min_size=1, max_size=5), max_size=12))
    reason = draw(st.sampled_from(["length", "eos_token", "stop_sequence", "error", "abort"]))
    frames = [Frame(tuple(group)) for group in ids]
    frames.append(Frame(tuple(draw(st.lists(one_id, max_size=3))), True, reason))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(frames)), max_size=6))))
    edges = [0, *cuts, len(frames)]
    return [frames[a:b] for a, b in itertools.pairwise(edges)]


@given(data=st.data(), chat=st.booleans(), usage=st.booleans())
def test_any_frames_in_any_grouping(
    smollm2_map: MapDecoder, data: st.DataObject, chat: bool, usage: bool
) -> None:
    batches = data.draw(frame_streams(smollm2_map))
    envelope = CHAT if chat else COMPLETIONS
    chunks = checked(
        events(rendered(smollm2_map, batches, envelope, include_usage=usage)), envelope
    )
    frames = [frame for batch in batches for frame in batch]
    decoder = TextDecoder(smollm2_map)
    text = "".join(decoder.feed(frame.ids) for frame in frames) + decoder.flush()
    assert text_of(chunks) == text
    word = finish.openai_finish_reason(frames[-1].finish_reason, chat=chat)
    assert finish_of(chunks) == word
    if word is None:
        assert chunks[-1]["error"]["code"] == "codec_stream_error"
        assert "finish_reason" in chunks[-1]["error"]["message"]
    elif usage:
        tokens = sum(len(frame.ids) for frame in frames)
        assert chunks[-1].choices == []
        assert chunks[-1].usage.model_dump(exclude_none=True) == {
            "prompt_tokens": 0,
            "completion_tokens": tokens,
            "total_tokens": tokens,
        }
    else:
        assert chunks[-1].choices[0].finish_reason == word


def test_the_role_chunk_comes_first_even_before_any_frame(smollm2_map: MapDecoder) -> None:
    renderer = SseRenderer(smollm2_map, CHAT)
    (role,) = events(renderer.feed([]) + b"data: [DONE]\n\n")[:-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert renderer.feed([]) == b""
    assert events(SseRenderer(smollm2_map, COMPLETIONS).feed([]) or b"data: [DONE]\n\n") == [DONE]


def test_a_failure_after_text_keeps_the_text_then_the_error(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = tuple(smollm2_vocabulary.loaded.tokenizer.encode("Hello world").ids)
    renderer = SseRenderer(smollm2_map, COMPLETIONS)
    body = renderer.feed([Frame(ids)]) + renderer.fail("the connection was lost")
    chunks = checked(events(body), COMPLETIONS)
    assert text_of(chunks) == "Hello world"
    assert chunks[-1] == {
        "error": {
            "message": "the connection was lost",
            "type": "server_error",
            "code": "codec_stream_error",
        }
    }
    body = SseRenderer(smollm2_map, CHAT).flush()
    assert "terminal frame" in checked(events(body), CHAT)[-1]["error"]["message"]


def test_tool_calls_without_an_id_or_a_name(smollm2_map: MapDecoder) -> None:
    calls = (ToolCall(None, "{}"), ToolCall("f", '{"a": 1}'))
    body = rendered(smollm2_map, [[Frame((), True, "tool_call", calls)]], CHAT)
    chunks = checked(events(body), CHAT)
    entries = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert [(e.index, e.id, e.type) for e in entries] == [
        (0, "call_0_chatcmpl-codec-1", "function"),
        (1, "call_1_chatcmpl-codec-1", "function"),
    ]
    assert [(e.function.name, e.function.arguments) for e in entries] == [
        ("", "{}"),
        ("f", '{"a": 1}'),
    ]
    final = accumulated([c.model_dump() for c in chunks]).choices[0]
    assert final.finish_reason == "tool_calls"
    assert [c.function.arguments for c in final.message.tool_calls or []] == ["{}", '{"a": 1}']


# --- the whole answer -------------------------------------------------------------------------


@pytest.mark.parametrize("name", STREAM_CAPTURES)
def test_captured_streams_as_one_answer(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, name: str
) -> None:
    envelope = CHAT if is_chat(name) else COMPLETIONS
    rules = TextRules(backend_ids=source_of(smollm2_vocabulary, name, "auto") == "backend")
    batches = transcoded(smollm2_vocabulary, name, "auto")
    renderer = CompletionRenderer(smollm2_map, envelope, rules=rules)
    outputs = [renderer.feed(batch) for batch in batches]
    # The body is out with the terminal frame, and only then.
    assert [bool(out) for out in outputs] == [False] * (len(outputs) - 1) + [True]
    assert renderer.done
    assert renderer.error is None
    assert renderer.flush() == renderer.fail("late") == b""
    document = orjson.loads(outputs[-1])
    tokens = sum(len(frame.ids) for batch in batches for frame in batch)
    assert document["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": tokens,
        "total_tokens": tokens,
    }
    if envelope.chat:
        answer = ChatCompletion.model_validate(document)
        choice = answer.choices[0]
        calls = choice.message.tool_calls or []
        assert (choice.message.content or "") == upstream_text(name)
        assert len(calls) == (2 if "tool-calls" in name else 0)
    else:
        completion = Completion.model_validate(document)
        assert completion.choices[0].text == upstream_text(name)
    assert document["choices"][0]["finish_reason"] == upstream_finish(name)
    assert (document["id"], document["created"], document["model"]) == (
        envelope.id,
        envelope.created,
        envelope.model,
    )


def test_a_failed_answer_is_an_error_object(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = tuple(smollm2_vocabulary.loaded.tokenizer.encode("Hello").ids)
    renderer = CompletionRenderer(smollm2_map, COMPLETIONS)
    assert renderer.feed([Frame(ids)]) == b""
    body = renderer.feed([Frame((), True, "error")])
    assert orjson.loads(body)["error"]["code"] == "codec_stream_error"
    assert renderer.error == "the Codec stream ended with finish_reason 'error'"
    unfinished = CompletionRenderer(smollm2_map, CHAT)
    assert b"terminal frame" in unfinished.flush()
    assert unfinished.error is not None


def test_a_chat_answer_with_calls_and_no_text_has_null_content(smollm2_map: MapDecoder) -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}', "call-1")
    body = CompletionRenderer(smollm2_map, CHAT).feed([Frame((), True, "tool_call", (call,))])
    message = ChatCompletion.model_validate(orjson.loads(body)).choices[0].message
    assert message.content is None
    assert message.tool_calls is not None
    assert message.tool_calls[0].model_dump() == {
        "id": "call-1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    body = CompletionRenderer(smollm2_map, CHAT).feed([Frame((), True, "eos_token")])
    assert ChatCompletion.model_validate(orjson.loads(body)).choices[0].message.content == ""


@given(text=st.text(max_size=60), slice_chars=st.integers(1, 8))
def test_a_long_text_is_escaped_in_slices_to_the_same_json(text: str, slice_chars: int) -> None:
    # orjson sets aside about 13 bytes a character for one string: a long text is escaped a
    # slice at a time, quotes, controls and surrogate-free astral characters alike.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openai_module, "_ESCAPED_CHARS", slice_chars)
        escaped = openai_module._json_text(text)
        assert orjson.dumps({"text": escaped}) == orjson.dumps({"text": text})


def test_a_frame_of_a_million_ids_renders_as_one_chunk(
    smollm2_map: MapDecoder,
) -> None:
    hello = smollm2_map.table.index(b"Hello")
    ids = (hello,) * 1_000_000
    renderer = SseRenderer(smollm2_map, COMPLETIONS)
    out = renderer.feed([Frame(ids), Frame((), True, "length")])
    first = json.loads(out.split(b"\n\n")[0].removeprefix(b"data: "))
    assert first["choices"][0]["text"] == "Hello" * 1_000_000
