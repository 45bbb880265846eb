"""A stream's frames to its text, tool calls and end: the captured streams give back the
upstream's text through the proxy's frames, at any split, and every way a stream ends."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.compression.flush import merge_frames
from proxy.core.render.turn import CONTENT, Piece, TextRules, TurnEnd, TurnReader
from proxy.core.stream.token_source import TokenIdMode
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.render.support import (
    STREAM_CAPTURES,
    TOOL_CALLS,
    is_chat,
    reports_ids,
    source_of,
    transcoded,
    transcoded_reads,
    upstream_finish,
    upstream_text,
)

WEATHER = ToolCall("get_weather", '{"city": "Paris"}', "chatcmpl-tool-8d1f")
TIME = ToolCall("get_time", '{"tz": "CET"}', "chatcmpl-tool-93ab")


def read(
    decoder: MapDecoder, batches: list[list[Frame]], *, chat: bool, rules: TextRules = CONTENT
) -> list[Piece]:
    turn = TurnReader(decoder, chat=chat, rules=rules)
    pieces = [piece for batch in batches for piece in turn.feed(batch)]
    return merged(pieces + turn.flush())


def merged(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
        else:
            out.append(piece)
    return out


def text_of(pieces: list[Piece]) -> str:
    return "".join(piece for piece in pieces if isinstance(piece, str))


@pytest.mark.parametrize("name", STREAM_CAPTURES)
@pytest.mark.parametrize("mode", ["auto", "retokenize"])
def test_captured_streams_render_to_the_upstreams_text(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, name: str, mode: TokenIdMode
) -> None:
    batches = transcoded(smollm2_vocabulary, name, mode)
    backend = source_of(smollm2_vocabulary, name, mode) == "backend"
    # In auto mode the frames carry the backend's own IDs wherever the capture reports them.
    assert backend == (mode == "auto" and reports_ids(name))
    pieces = read(smollm2_map, batches, chat=is_chat(name), rules=TextRules(backend_ids=backend))
    # Reasoning is text on the wire too (docs/ENDPOINTS.md): it renders as content.
    assert text_of(pieces) == upstream_text(name)
    assert pieces[-1] == TurnEnd(upstream_finish(name))
    calls = [piece for piece in pieces if isinstance(piece, ToolCall)]
    assert calls == ([WEATHER, TIME] if name == TOOL_CALLS else [])


def test_the_backends_ids_carry_the_tool_call_markup_on_the_frames_with_the_calls(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    batches = transcoded(smollm2_vocabulary, TOOL_CALLS, "auto")
    assert source_of(smollm2_vocabulary, TOOL_CALLS, "auto") == "backend"
    # Read as if every ID were content, the markup the backend's parser consumed shows.
    naive = text_of(read(smollm2_map, batches, chat=True))
    assert naive.startswith("Let me check.\n<tool_call>\n{")
    pieces = read(smollm2_map, batches, chat=True, rules=TextRules(backend_ids=True))
    assert pieces == ["Let me check.", WEATHER, TIME, TurnEnd("tool_calls")]


@pytest.mark.parametrize("mode", ["auto", "retokenize"])
@given(cuts=st.lists(st.integers(0, 20), max_size=20), backend=st.booleans())
def test_any_grouping_of_frames_into_reads_gives_the_same_turn(
    smollm2_map: MapDecoder,
    smollm2_vocabulary: Vocabulary,
    mode: TokenIdMode,
    cuts: list[int],
    backend: bool,
) -> None:
    frames = [f for batch in transcoded(smollm2_vocabulary, TOOL_CALLS, mode) for f in batch]
    edges = [0, *sorted({min(c, len(frames)) for c in cuts}), len(frames)]
    batches = [frames[a:b] for a, b in itertools.pairwise(edges)]
    rules = TextRules(backend_ids=backend)
    assert read(smollm2_map, batches, chat=True, rules=rules) == read(
        smollm2_map, [frames], chat=True, rules=rules
    )


@pytest.mark.parametrize("name", STREAM_CAPTURES)
@given(cuts=st.lists(st.integers(0, 1 << 14), max_size=6))
def test_captured_streams_render_the_same_however_reads_and_flush_windows_group_them(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, name: str, cuts: list[int]
) -> None:
    # A proxy that falls behind reads several events at once (one frame per read), and a
    # compressed stream merges the frames of a flush window: the text before a tool call
    # must never share a frame with the call, or a reader takes it for the call's markup.
    backend = source_of(smollm2_vocabulary, name, "auto") == "backend"
    rules = TextRules(backend_ids=backend)
    expected = read(
        smollm2_map, transcoded(smollm2_vocabulary, name, "auto"), chat=is_chat(name), rules=rules
    )
    batches = transcoded_reads(smollm2_vocabulary, name, "auto", cuts)
    chat = is_chat(name)
    assert read(smollm2_map, batches, chat=chat, rules=rules) == expected
    window = [merge_frames([frame for batch in batches for frame in batch])]
    assert read(smollm2_map, window, chat=chat, rules=rules) == expected


def test_a_read_holding_text_and_a_finished_call_keeps_the_text(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    # The whole stream in one read: "Let me check." is confirmed before call 0 completes.
    batches = transcoded_reads(smollm2_vocabulary, TOOL_CALLS, "auto", [])
    pieces = read(smollm2_map, batches, chat=True, rules=TextRules(backend_ids=True))
    assert pieces == ["Let me check.", WEATHER, TIME, TurnEnd("tool_calls")]


def hello(smollm2_vocabulary: Vocabulary) -> tuple[int, ...]:
    """The IDs of "Hello world"."""
    return tuple(smollm2_vocabulary.loaded.tokenizer.encode("Hello world").ids)


@pytest.mark.parametrize(
    ("codec", "openai"),
    [
        ("length", "length"),
        ("eos_token", "stop"),
        ("stop_sequence", "stop"),
        ("policy_violation", "content_filter"),
        ("tool_call", "tool_calls"),
        ("stop", "stop"),
    ],
)
def test_every_finish_reason(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, codec: str, openai: str
) -> None:
    ids = hello(smollm2_vocabulary)
    frames = [[Frame(ids[:1]), Frame(ids[1:], True, codec)]]
    assert read(smollm2_map, frames, chat=True) == ["Hello world", TurnEnd(openai)]
    completion = "stop" if codec == "tool_call" else openai
    assert read(smollm2_map, frames, chat=False) == ["Hello world", TurnEnd(completion)]


@pytest.mark.parametrize("reason", ["error", "abort", None, ""])
def test_an_error_or_an_unknown_word_fails_the_turn_after_its_text(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, reason: str | None
) -> None:
    ids = hello(smollm2_vocabulary)
    pieces = read(smollm2_map, [[Frame(ids), Frame((), True, reason)]], chat=True)
    assert pieces[0] == "Hello world"
    end = pieces[1]
    assert isinstance(end, TurnEnd)
    assert end.finish_reason is None
    shown = "none" if reason is None else repr(reason)
    assert end.error == f"the Codec stream ended with finish_reason {shown}"


def test_a_body_without_a_terminal_frame_fails(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = hello(smollm2_vocabulary)
    turn = TurnReader(smollm2_map, chat=False)
    assert turn.feed([Frame(ids)]) == ["Hello world"]
    assert turn.flush() == [TurnEnd(None, "the Codec stream ended before its terminal frame")]
    assert turn.flush() == turn.fail("again") == turn.feed([Frame(ids, True, "length")]) == []
    assert turn.tokens == len(ids)


def test_an_id_past_the_maps_vocabulary_fails_the_turn_after_the_text_before(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = hello(smollm2_vocabulary)
    size = smollm2_map.vocab_size
    for beyond in (size, size + 1, 0xFFFFFFFF):
        turn = TurnReader(smollm2_map, chat=True)
        pieces = turn.feed([Frame(ids), Frame((*ids, beyond)), Frame(ids, True, "length")])
        assert pieces[0] == "Hello world"  # the frames before it; never a replacement character
        end = pieces[1]
        assert isinstance(end, TurnEnd)
        assert (end.finish_reason, end.map_drift) == (None, True)
        assert end.error == (
            f"the Codec stream's token ID {beyond} is past the {size} IDs of map "
            f"{smollm2_map.name}: the server's IDs follow another map than the one it names"
        )
        assert len(pieces) == 2
        assert turn.end == end
    # An ID within the vocabulary that the map lists no bytes for is the map's own gap.
    padded = MapDecoder(smollm2_map.table, smollm2_map.special, encoder="byte_level",
                        vocab_size=size + 64)  # fmt: skip
    pieces = TurnReader(padded, chat=False).feed([Frame((*ids, size), True, "length")])
    assert pieces == ["Hello world\ufffd", TurnEnd("length")]


def test_nothing_counts_after_the_end(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = hello(smollm2_vocabulary)
    turn = TurnReader(smollm2_map, chat=False)
    turn.feed([Frame(ids, True, "length"), Frame(ids)])
    assert turn.end == TurnEnd("length")
    assert turn.tokens == len(ids)


def test_a_stop_string_cuts_the_text_and_makes_the_turn_stop(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = tuple(smollm2_vocabulary.loaded.tokenizer.encode("It is Paris! And more").ids)
    frames = [[Frame((i,)) for i in ids[:-1]], [Frame(ids[-1:], True, "length")]]
    rules = TextRules(stop=(" Paris!",))
    assert read(smollm2_map, frames, chat=False, rules=rules) == ["It is", TurnEnd("stop")]
    # Text that only began a stop string is released at the end.
    ids = tuple(smollm2_vocabulary.loaded.tokenizer.encode("It is Par").ids)
    frames = [[Frame(ids, True, "length")]]
    assert read(smollm2_map, frames, chat=False, rules=rules) == ["It is Par", TurnEnd("length")]


def test_text_comes_before_the_calls_of_its_frame_and_completions_have_none(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    ids = hello(smollm2_vocabulary)
    frames = [[Frame(ids, tool_calls=(WEATHER,)), Frame((), True, "tool_call", (TIME,))]]
    assert read(smollm2_map, frames, chat=True) == [
        "Hello world",
        WEATHER,
        TIME,
        TurnEnd("tool_calls"),
    ]
    assert read(smollm2_map, frames, chat=False) == ["Hello world", TurnEnd("stop")]
