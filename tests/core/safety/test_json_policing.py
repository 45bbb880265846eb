"""JSON responses under a policy: SSE streams (every split) and whole bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.core.errors import UpstreamProtocolError
from proxy.core.safety.json_policing import (
    CHAT_DELTA,
    CHAT_MESSAGE,
    COMPLETION_TEXT,
    JsonStreamPolicer,
    TextField,
    police_json_body,
)
from proxy.core.safety.rules import CompiledRules
from proxy.core.safety.stream import PolicedText
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.safety.support import compiled
from tests.core.safety.test_policed_streams import vocab
from tests.fake_upstream import load_capture

Event = dict[str, Any] | str


def factory(rules: CompiledRules, vocabulary: Vocabulary):
    return lambda: PolicedText(rules, vocabulary.scheme, vocabulary.loaded.tokenizer)


def chunks(sse: bytes) -> list[Event]:
    out: list[Event] = []
    for event in sse.split(b"\n\n"):
        if event:
            data = event.decode().removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def police(
    rules: CompiledRules, vocabulary: Vocabulary, body: bytes, cut: int, field: TextField
) -> tuple[bytes, JsonStreamPolicer]:
    policer = JsonStreamPolicer(factory(rules, vocabulary), field)
    out = b""
    for piece in (body[:cut], body[cut:]):
        out += policer.feed(piece)
        if policer.stopped:
            return out, policer
    return out + policer.flush(), policer


def text_of(events: list[Event], field: TextField) -> str:
    return "".join(
        field.get(choice) for e in events if isinstance(e, dict) for choice in e["choices"]
    )


CAPTURE = load_capture("llamacpp-completions-sample.txt")


@pytest.mark.parametrize("cut", range(0, len(CAPTURE.body), 53))
def test_stop_ends_with_content_filter_then_done(smollm2_vocabulary: Vocabulary, cut: int):
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["New Haven"])
    out, policer = police(rules, smollm2_vocabulary, CAPTURE.body, cut, COMPLETION_TEXT)
    events = chunks(out)
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert isinstance(final, dict)
    assert final["choices"][0]["finish_reason"] == "content_filter"
    assert final["id"] == "chatcmpl-AprjTvbnsABM7jJIwQbflbTpAGt3TC66"  # from the upstream chunk
    text = text_of(events, COMPLETION_TEXT)
    assert "New" not in text
    assert CAPTURE.stream_text().startswith(text)
    assert policer.stopped == "halt"
    assert sum(1 for e in events if e == "[DONE]") == 1


def test_clean_stream_keeps_text_and_every_other_field(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    out, policer = police(rules, smollm2_vocabulary, CAPTURE.body, 200, COMPLETION_TEXT)
    events, upstream = chunks(out), chunks(CAPTURE.body)
    assert len(events) == len(upstream)
    assert text_of(events, COMPLETION_TEXT) == CAPTURE.stream_text()
    for ours, theirs in zip(events, upstream, strict=True):
        if isinstance(ours, dict) and isinstance(theirs, dict):
            for choice in theirs["choices"]:
                choice.pop("text")
            for choice in ours["choices"]:
                choice.pop("text")
            assert ours == theirs
    assert policer.stopped is None


def test_redaction_in_a_chat_stream(smollm2_vocabulary: Vocabulary) -> None:
    capture = load_capture("llamacpp-chat-sample.txt")  # "I'm glad you're"
    rules = compiled(vocab(smollm2_vocabulary), redact_strings=["glad"], placeholder="***")
    out, policer = police(rules, smollm2_vocabulary, capture.body, 10, CHAT_DELTA)
    # Spans are whole tokens: SmolLM2's " glad" carries the space, so it goes too.
    assert text_of(chunks(out), CHAT_DELTA) == "I'm*** you're"
    assert policer.verdict.redactions == ("mask",)
    # The role-only first delta keeps its `content: null`.
    first = chunks(out)[0]
    assert isinstance(first, dict)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}


def test_several_choices_are_policed_apart(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["bad"])

    def event(index: int, text: str, finish: str | None = None) -> bytes:
        choice = {"index": index, "text": text, "finish_reason": finish}
        return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"

    body = event(0, "fine ") + event(1, "also b") + event(0, "stuff", "length") + event(1, "ad!")
    out, _policer = police(
        rules, smollm2_vocabulary, body + b"data: [DONE]\n\n", 0, COMPLETION_TEXT
    )
    events = chunks(out)
    texts: dict[int, str] = {}
    for e in events:
        if isinstance(e, dict):
            for choice in e["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "fine stuff", 1: "also"}  # " bad" is one token, space included
    final = events[-2]
    assert isinstance(final, dict)
    assert final["choices"] == [{"index": 1, "text": "", "finish_reason": "content_filter"}]


def test_text_after_a_choice_finished_is_not_forwarded(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    policer = JsonStreamPolicer(factory(rules, smollm2_vocabulary), COMPLETION_TEXT)
    done = b'data: {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]}\n\n'
    late = b'data: {"choices": [{"index": 0, "text": "zebra", "finish_reason": null}]}\n\n'
    assert b'"ok"' in policer.feed(done)
    assert policer.feed(late) == b""


def test_unparsable_events_are_dropped_not_forwarded(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    policer = JsonStreamPolicer(factory(rules, smollm2_vocabulary), COMPLETION_TEXT)
    assert policer.feed(b'data: {"choices": [{"text": "zeb\n\n') == b""
    assert policer.dropped_events == 1


def surrogate_event(text: str, finish: str | None = None, **fields: Any) -> bytes:
    # json.dumps writes a lone surrogate as the escape a server that cut a pair sends.
    choice = {"index": 0, "text": text, "finish_reason": finish, **fields}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


def test_a_surrogate_pair_cut_between_events_is_rejoined(smollm2_vocabulary: Vocabulary):
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    body = (
        surrogate_event("Hello \ud83c", logprobs={"content": [{"token": "\ud83c"}]})
        + surrogate_event("\udf89 world")
        + surrogate_event("", "stop")
        + b"data: [DONE]\n\n"
    )
    for cut in range(len(body) + 1):
        out, policer = police(rules, smollm2_vocabulary, body, cut, COMPLETION_TEXT)
        events = chunks(out)
        assert text_of(events, COMPLETION_TEXT) == "Hello 🎉 world", cut
        assert policer.dropped_events == 0
        # A field the policy does not read goes on as the upstream sent it.
        logprobs = [c.get("logprobs") for e in events if isinstance(e, dict) for c in e["choices"]]
        assert {"content": [{"token": "\ud83c"}]} in logprobs
        assert events[-1] == "[DONE]"


@pytest.mark.parametrize(
    "body",
    [
        surrogate_event("Hello") + surrogate_event(" a\udf89 b"),
        surrogate_event("Hello") + surrogate_event(" a\ud83c") + surrogate_event(" b"),
        surrogate_event("Hello") + surrogate_event(" a\ud83c", "stop"),
        surrogate_event("Hello") + surrogate_event(" a\ud83c"),  # then the upstream closes
    ],
    ids=["low-half", "unpaired-high", "high-at-the-finish", "high-at-the-end"],
)
def test_a_lone_surrogate_is_an_upstream_error_not_a_dropped_event(
    smollm2_vocabulary: Vocabulary, body: bytes
) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    for cut in range(len(body) + 1):
        with pytest.raises(UpstreamProtocolError, match="surrogate"):
            police(rules, smollm2_vocabulary, body, cut, COMPLETION_TEXT)


def test_whole_bodies(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(
        vocab(smollm2_vocabulary), stop_strings=["Haven"], redact_strings=["city"], placeholder="#"
    )
    body = json.dumps(
        {
            "id": "c1",
            "choices": [
                {"index": 0, "text": "the city of New Haven is old", "finish_reason": "length"},
                {"index": 1, "text": "a city", "finish_reason": "stop"},
            ],
            "usage": {"completion_tokens": 9},
        }
    ).encode()
    policed, verdict = police_json_body(body, factory(rules, smollm2_vocabulary), COMPLETION_TEXT)
    document = json.loads(policed)
    assert [c["text"] for c in document["choices"]] == ["the# of New", "a#"]
    assert [c["finish_reason"] for c in document["choices"]] == ["content_filter", "stop"]
    assert document["usage"] == {"completion_tokens": 9}
    assert verdict.stop == "halt"
    chat = json.dumps(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "big city"}}]}
    ).encode()
    policed, _ = police_json_body(chat, factory(rules, smollm2_vocabulary), CHAT_MESSAGE)
    message = json.loads(policed)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "big#"}


@pytest.mark.parametrize("body", [b"not json", b'{"no": "choices"}', b'{"choices": [1]}'])
def test_bodies_that_cannot_be_checked_are_refused(smollm2_vocabulary: Vocabulary, body: bytes):
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["zebra"])
    with pytest.raises(UpstreamProtocolError):
        police_json_body(body, factory(rules, smollm2_vocabulary), COMPLETION_TEXT)


def test_text_a_normalizer_would_change_is_released_as_streamed(qwen3_vocabulary: Vocabulary):
    # The policy reads the retokenized IDs' text: Qwen3's NFC must not reach the client.
    rules = compiled(vocab(qwen3_vocabulary), stop_strings=["zebra"])
    text = "Un cafe\u0301 et l'\u212bngstro\u0308m."
    body = b"".join(surrogate_event(text[i : i + 4]) for i in range(0, len(text), 4))
    body += surrogate_event("", "stop") + b"data: [DONE]\n\n"
    for cut in range(0, len(body) + 1, 17):
        out, _ = police(rules, qwen3_vocabulary, body, cut, COMPLETION_TEXT)
        assert text_of(chunks(out), COMPLETION_TEXT) == text, cut
