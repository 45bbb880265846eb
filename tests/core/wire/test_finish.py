"""finish_reason both ways: OpenAI's words to Codec's and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.wire import finish
from proxy.core.wire.finish import codec_finish_reason, openai_finish_reason

OPENAI_WORDS = ("length", "stop", "content_filter", "tool_calls", "function_call")


@pytest.mark.parametrize(
    ("upstream", "stop_reason", "codec"),
    [
        ("length", None, "length"),
        ("stop", None, "eos_token"),
        ("stop", " 6", "stop_sequence"),
        ("stop", 128009, "stop_sequence"),
        ("eos_token", None, "eos_token"),
        ("stop_sequence", None, "stop_sequence"),
        ("content_filter", None, "policy_violation"),
        ("tool_calls", None, "eos_token"),
        ("abort", None, "error"),
    ],
)
def test_openai_to_codec(upstream: str, stop_reason: str | int | None, codec: str) -> None:
    assert codec_finish_reason(upstream, stop_reason) == codec


@pytest.mark.parametrize("word", ["length", "stop", "content_filter"])
def test_the_round_trip_keeps_what_a_client_can_tell_apart(word: str) -> None:
    for chat in (False, True):
        assert openai_finish_reason(codec_finish_reason(word), chat=chat) == word
        assert openai_finish_reason(codec_finish_reason(word, "</s>"), chat=chat) == (
            "stop" if word == "stop" else word
        )


def test_a_tool_call_turn_is_tool_calls_in_a_chat_only() -> None:
    assert openai_finish_reason(finish.TOOL_CALL, chat=True) == "tool_calls"
    assert openai_finish_reason(finish.TOOL_CALL, chat=False) == "stop"


@given(st.text(max_size=20) | st.none())
def test_error_and_unknown_words_have_no_openai_word(reason: str | None) -> None:
    known = {"length", "eos_token", "stop_sequence", "stop", "policy_violation", "tool_call"}
    rendered = openai_finish_reason(reason, chat=True)
    assert (rendered is None) == (reason not in known)
    assert rendered in (None, *OPENAI_WORDS)
