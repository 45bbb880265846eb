"""The transcoder's ID source decision and tool-call assembly, sans-IO: SSE bytes in, frames out."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.tool_calls import ToolCallAssembler, ToolCallDelta
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.core.wire.tool_calls import ToolCall
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.stream.test_surrogates import utf16_units


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


def text(value: str, ids: list[int] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": value, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def call(index: int, name: str | None = None, args: str = "", id: str | None = None) -> Any:
    function = {"arguments": args} | ({"name": name} if name else {})
    return {"index": index, "function": function} | ({"id": id} if id else {})


def transcoder(vocabulary: Vocabulary, mode: Any, chat: bool = False) -> CodecTranscoder:
    return CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if chat else parse_completion_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )


# --- the source decision ----------------------------------------------------------------------


def test_auto_waits_for_output_then_decides(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "auto", chat=True)
    assert t.feed(sse(delta(role="assistant", content=None))) == []
    assert [t.token_source] == [None]  # a role-only delta says nothing
    frames = t.feed(sse({"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [5]}]}))
    assert t.token_source == "backend"
    assert frames == []  # "Hi" is not what ID 5 renders: retokenized, held until final
    (terminal,) = t.feed(sse(delta("stop")))
    assert terminal.ids == tuple(smollm2_vocabulary.scheme.encode("Hi", at_start=True))
    assert t.outcome is not None
    assert (t.outcome.token_source, t.outcome.retokenized_spans) == ("backend", 1)


@pytest.mark.parametrize(
    ("mode", "source"), [("auto", "retokenized"), ("backend", "backend"), ("retokenize", None)]
)
def test_a_stream_without_output(smollm2_vocabulary: Vocabulary, mode: Any, source: Any) -> None:
    t = transcoder(smollm2_vocabulary, mode)
    assert t.token_source == ("retokenized" if mode == "retokenize" else None)
    assert t.feed(sse(text("", finish="length"))) == [Frame((), True, "length")]
    assert t.token_source == (source or "retokenized")


def test_backend_mode_refuses_a_stream_without_ids(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "backend")
    assert t.feed(sse(text("Hello"), text(" world", [1]))) == [Frame((), True, "error")]
    assert t.outcome is not None
    assert "no token IDs" in (t.outcome.error or "")


def test_retokenize_ignores_reported_ids(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize")
    frames = t.feed(sse(text("Hello", [9]), text(" world", [9], "length")))
    expected = smollm2_vocabulary.scheme.encode("Hello world", at_start=True)
    assert [i for f in frames for i in f.ids] == expected


def test_backend_ids_may_run_ahead_until_the_end(smollm2_vocabulary: Vocabulary) -> None:
    # vLLM reports the bytes of an incomplete character while it holds back its text; the
    # text of one that max_tokens cut never comes.
    t = transcoder(smollm2_vocabulary, "backend")
    assert t.feed(sse(text("、", [29917]))) == [Frame((29917,))]
    assert t.feed(sse(text("", [10391]))) == []
    assert t.feed(sse(text("ア", [112]))) == [Frame((10391, 112))]
    assert t.feed(sse(text("", [11100], "length"))) == [Frame((11100,), True, "length")]


def test_a_stop_string_reported_with_no_text_is_not_sent(smollm2_vocabulary: Vocabulary) -> None:
    # llama.cpp (tests/fixtures/upstream/llamacpp-completions-stop-logprobs.txt): `stop: [" has"]`
    # reports " has" in a chunk with text "", then finishes; the JSON answer ends before it.
    t = transcoder(smollm2_vocabulary, "backend")
    frames = t.feed(sse(text(" States", [1918]), text("", [553]), text("", None, "stop")))
    assert frames == [Frame((1918,), True, "eos_token")]


def test_a_tool_call_region_reported_with_no_text_is_sent(smollm2_vocabulary: Vocabulary) -> None:
    # The same shape in a turn that ended in tool calls: the region's IDs stay in `ids`, on
    # the frame that carries the call; the text before it leaves first, in a frame of its own.
    t = transcoder(smollm2_vocabulary, "backend", chat=True)
    region = {"index": 0, "delta": {"tool_calls": [call(0, "f", "{}", "c")]}, "token_ids": [553]}
    frames = t.feed(
        sse({"choices": [{"index": 0, "delta": {"content": " States"}, "token_ids": [1918]}]})
        + sse({"choices": [region]}, delta("tool_calls"))
    )
    assert [(f.ids, f.finish_reason, len(f.tool_calls)) for f in frames] == [
        ((1918,), None, 0),
        ((553,), "tool_call", 1),
    ]


# --- tool calls -------------------------------------------------------------------------------

WEATHER = ToolCall("get_weather", '{"city": "Paris"}', "call_1")


def test_assembler_completes_a_call_when_the_next_starts() -> None:
    assembler = ToolCallAssembler()
    assert assembler.feed((ToolCallDelta(0, "call_1", "get_weather"),)) == []
    assert assembler.feed((ToolCallDelta(0, arguments='{"city": '),)) == []
    # A repeated name or id does not change the call (some servers repeat them).
    assert assembler.feed((ToolCallDelta(0, "other", "other", '"Paris"}'),)) == []
    assert assembler.feed((ToolCallDelta(1, "call_2", "f"),)) == [WEATHER]
    assert assembler.pending
    assert assembler.flush() == [ToolCall("f", "", "call_2")]
    assert assembler.emitted == 2
    assert not assembler.pending


def test_assembler_refuses_a_call_that_changes_after_it_was_sent() -> None:
    assembler = ToolCallAssembler()
    assembler.feed((ToolCallDelta(0, "a", "f"), ToolCallDelta(1, "b", "g")))
    with pytest.raises(UpstreamProtocolError, match="tool call 0"):
        assembler.feed((ToolCallDelta(0, arguments="x"),))


def test_calls_wait_for_a_frame_with_ids(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    first = delta(tool_calls=[call(0, "get_weather", '{"city": "Paris"}', "call_1")])
    # Call 0 completes when call 1 starts; no IDs yet, so no frame (none may be empty).
    assert t.feed(sse(first, delta(tool_calls=[call(1, "f", "{}", "call_2")]))) == []
    frames = t.feed(sse(delta(content="Done. And"), delta(content=" more")))
    assert frames[0].tool_calls == (WEATHER,)
    (terminal,) = t.feed(sse(delta("tool_calls")))
    assert terminal.tool_calls == (ToolCall("f", "{}", "call_2"),)
    assert terminal.finish_reason == "tool_call"


def test_finish_tool_calls_without_any_call_is_eos(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    (terminal,) = t.feed(sse(delta(content="ok"), delta("tool_calls")))
    assert (terminal.finish_reason, terminal.tool_calls) == ("eos_token", ())


def test_upstream_error_keeps_whole_calls_only(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    calls = [call(0, "get_weather", '{"city": "Paris"}', "call_1"), call(1, "f", '{"a', "c2")]
    frames = t.feed(sse(delta(tool_calls=calls)) + b'data: {"error": {"message": "boom"}}\n\n')
    assert frames == [Frame((), True, "error", (WEATHER,))]


def test_out_of_order_call_index_ends_the_stream(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    frames = t.feed(sse(delta(tool_calls=[call(1, "g")]), delta(tool_calls=[call(0, "f")])))
    assert [(f.done, f.finish_reason) for f in frames] == [(True, "error")]
    assert t.outcome is not None
    assert "tool call 0" in (t.outcome.error or "")


def test_token_bytes_are_required_for_backend_ids(smollm2_vocabulary: Vocabulary) -> None:
    with pytest.raises(ValueError, match="TokenBytes"):
        CodecTranscoder(smollm2_vocabulary.scheme, parse_completion_chunk, token_ids="auto")


# --- the text the IDs must account for (on_text, for a sampled stream's verifier) ------------


@pytest.mark.parametrize("mode", ["retokenize", "auto", "backend"])
def test_on_text_hears_each_chunk_text_the_id_source_gets(
    smollm2_vocabulary: Vocabulary, mode: Any
) -> None:
    heard: list[str] = []
    t = CodecTranscoder(
        smollm2_vocabulary.scheme,
        parse_completion_chunk,
        token_ids=mode,
        token_bytes=smollm2_vocabulary.token_bytes,
        on_text=heard.append,
    )
    t.feed(sse(text("Hello", [19556]), text("", [2]), text(" world", [905], "length")))
    t.feed(sse(text("after the end", [9])))
    t.flush()
    assert heard == ["Hello", " world"]  # never empty, nothing after the terminal frame


def test_on_text_hears_nothing_of_a_refused_stream(smollm2_vocabulary: Vocabulary) -> None:
    heard: list[str] = []
    t = transcoder(smollm2_vocabulary, "backend")
    t.on_text = heard.append
    assert t.feed(sse(text("Hello"))) == [Frame((), True, "error")]
    assert heard == []


MODES = ("retokenize", "auto", "backend")


# --- text a broken upstream cuts: UTF-16 surrogate pairs, faults of ours ------------------------

SPLIT = "Hello 🎉 world"


def render(vocabulary: Vocabulary, frames: list[Frame]) -> bytes:
    pieces = vocabulary.token_bytes.render([i for frame in frames for i in frame.ids])
    assert pieces is not None
    return b"".join(pieces)


def one_terminal(frames: list[Frame]) -> Frame:
    assert [frame.done for frame in frames] == [False] * (len(frames) - 1) + [True]
    assert all(frame.ids for frame in frames[:-1])
    return frames[-1]


@pytest.mark.parametrize("mode", ["retokenize", "auto", "backend"])
def test_a_surrogate_pair_cut_between_events_is_rejoined(
    smollm2_vocabulary: Vocabulary, mode: Any
) -> None:
    # Some servers cut a UTF-16 pair in two: "Hello \ud83c" then "\udf89 world" (JSON escapes).
    ids = smollm2_vocabulary.scheme.encode(SPLIT, at_start=True)
    body = sse(text("Hello \ud83c", ids[:2]), text("\udf89 world", ids[2:]), text("", [], "stop"))
    for cut in range(len(body) + 1):
        t = transcoder(smollm2_vocabulary, mode)
        frames = t.feed(body[:cut]) + t.feed(body[cut:]) + t.flush()
        assert one_terminal(frames).finish_reason == "eos_token", cut
        assert render(smollm2_vocabulary, frames) == SPLIT.encode(), cut


astral = st.characters(min_codepoint=0x1F300, max_codepoint=0x1F64F)
split_texts = st.lists(
    st.one_of(astral, st.sampled_from([" ", "a", "日本", "é", "\n"])), min_size=1
)


@given(
    value=split_texts.map("".join), cuts=st.lists(st.integers(0, 60)), mode=st.sampled_from(MODES)
)
def test_pairs_cut_anywhere_are_rejoined(
    smollm2_vocabulary: Vocabulary, value: str, cuts: list[int], mode: Any
) -> None:
    units = utf16_units(value)
    bounds = sorted({0, len(units), *(min(cut, len(units)) for cut in cuts)})
    pieces = [units[a:b] for a, b in itertools.pairwise(bounds)]
    # Backend IDs all come with the first event (running ahead of its text).
    ids = smollm2_vocabulary.scheme.encode(value, at_start=True)
    events = [text(piece, ids if not index else []) for index, piece in enumerate(pieces)]
    t = transcoder(smollm2_vocabulary, mode)
    frames = t.feed(sse(*events, text("", [], "length"))) + t.flush()
    assert one_terminal(frames).finish_reason == "length"
    assert render(smollm2_vocabulary, frames) == value.encode()


@pytest.mark.parametrize("mode", ["retokenize", "auto", "backend"])
@pytest.mark.parametrize(
    "events",
    [
        [text("Hello", [19556]), text(" a\udf89 b", [])],  # a low half alone
        [text("Hello", [19556]), text(" a\ud83c", []), text(" b", [])],  # not followed by it
        [text("Hello", [19556]), text(" a\ud83c", [], "stop")],  # the stream ends on it
    ],
    ids=["low-half", "unpaired-high", "high-at-the-end"],
)
def test_a_lone_surrogate_ends_the_stream_with_one_error_frame(
    smollm2_vocabulary: Vocabulary, mode: Any, events: list[dict[str, Any]]
) -> None:
    body = sse(*events)
    for cut in range(len(body) + 1):
        t = transcoder(smollm2_vocabulary, mode)
        frames = t.feed(body[:cut]) + t.feed(body[cut:]) + t.flush()
        assert one_terminal(frames) == Frame((), True, "error"), cut
        assert render(smollm2_vocabulary, frames).startswith(b"Hello")  # the text before it
        assert t.outcome is not None
        assert "surrogate" in (t.outcome.error or "")
        assert not t.outcome.internal


def test_a_fault_of_ours_still_ends_the_stream_once(smollm2_vocabulary: Vocabulary) -> None:
    seen = 0

    def parse(data: str) -> Any:
        nonlocal seen
        seen += 1
        if seen == 2:
            raise RuntimeError("boom")
        return parse_completion_chunk(data)

    t = CodecTranscoder(smollm2_vocabulary.scheme, parse)
    frames = t.feed(sse(text("Hello"), text(" world"), text("!", finish="stop")))
    assert one_terminal(frames) == Frame((), True, "error")
    assert t.outcome is not None
    assert (t.outcome.internal, t.outcome.error) == (True, "internal error: RuntimeError: boom")
    assert t.feed(sse(text("more"))) == t.flush() == t.fail("late") == []


def test_an_id_source_that_breaks_while_ending_still_ends_the_stream(
    smollm2_vocabulary: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize")
    assert t.feed(sse(text("Hello world"))) != []
    source = t._source
    assert source is not None

    def broken(**_: Any) -> list[int]:
        raise TypeError("TextInputSequence must be str")

    monkeypatch.setattr(source, "flush", broken)
    assert t.fail("upstream went away") == [Frame((), True, "error")]
    assert t.outcome is not None
    assert t.outcome.internal
    assert t.outcome.error == (
        "upstream went away; then internal error: TypeError: TextInputSequence must be str"
    )


def test_a_pair_cut_between_argument_pieces_is_rejoined(smollm2_vocabulary: Vocabulary) -> None:
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    frames = t.feed(
        sse(
            delta(tool_calls=[call(0, "f", '{"e": "\ud83c', "c")]),
            delta(tool_calls=[call(0, args='\udf89"}')]),
            delta(content="ok"),
            delta("tool_calls"),
        )
    )
    assert one_terminal(frames).tool_calls == (ToolCall("f", '{"e": "🎉"}', "c"),)
    assert all(encoder_for(fmt).encode(frames[-1]) for fmt in ("msgpack", "protobuf"))
    # One half alone: the call is not whole, the stream ends with an error.
    t = transcoder(smollm2_vocabulary, "retokenize", chat=True)
    frames = t.feed(sse(delta(tool_calls=[call(0, "f", '{"e": "\ud83c"}', "c")]), delta("stop")))
    assert one_terminal(frames) == Frame((), True, "error")


@pytest.mark.parametrize("mode", MODES)
def test_text_the_vocabulary_cannot_spell_ends_the_stream(
    smollm2_vocabulary: Vocabulary, mode: Any
) -> None:
    # SmolLM2 has no token for the byte 0x16: no IDs can give a client this text, so it is
    # not handed other text in silence.
    t = transcoder(smollm2_vocabulary, mode)
    frames = t.feed(sse(text("Hello world, ", [19556, 905, 28]), text("a\x16b", [])))
    frames += t.feed(sse(text(" more", [], "stop"))) + t.flush()
    assert one_terminal(frames) == Frame((), True, "error")
    assert render(smollm2_vocabulary, frames) == b"Hello world, a"  # all before it
    assert t.outcome is not None
    assert "cannot spell (U+0016)" in (t.outcome.error or "")
    assert not t.outcome.internal


def test_a_vocabulary_the_screen_cannot_list_still_refuses(smollm2_vocabulary: Vocabulary) -> None:
    # Where the unspellable characters are too many to list (a continuation byte without a
    # token), the retokenizer refuses the text itself; the stream still ends once, as an
    # upstream error, never as other text.
    scheme = dataclasses.replace(smollm2_vocabulary.scheme, unspellable=None)
    t = CodecTranscoder(scheme, parse_completion_chunk)
    frames = t.feed(sse(text("Hello world, a\x16b more", [], "stop"))) + t.flush()
    assert one_terminal(frames) == Frame((), True, "error")
    assert t.outcome is not None
    assert (t.outcome.internal, t.outcome.error) == (
        False,
        "the upstream's text has a character the model's vocabulary cannot spell "
        "(no token for the byte 0x16)",
    )
