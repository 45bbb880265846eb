"""Which requests the transport asks Codec for, and which answers send it back to JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.client.ask import (
    CLIENT_VERSION,
    REFUSAL_STATUSES,
    CodecAsk,
    Fallback,
    RefusalMemory,
    codec_ask,
    codec_ask_for,
    codec_headers,
    fallback_for,
)
from proxy.core.render.turn import TextRules

MESSAGES = [{"role": "user", "content": "Hi"}]


def ask(body: Any, path: str = "/v1/chat/completions", method: str = "POST") -> CodecAsk | str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return codec_ask(method, path, raw, stream_format="protobuf")


@pytest.mark.parametrize(
    ("path", "body", "endpoint"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": MESSAGES, "stream": True}, "chat"),
        ("/v1/chat/completions/", {"messages": MESSAGES, "stream": True, "n": 1}, "chat"),
        ("/proxy/v1/completions", {"prompt": "a", "stream": True, "logprobs": None}, "completions"),
        ("/v1/completions", {"prompt": [1, 2, 3], "stream": True, "best_of": 1}, "completions"),
        ("/v1/chat/completions", {"messages": MESSAGES, "stream": True, "tools": []}, "chat"),
        ("/v1/chat/completions", {"messages": [], "stream": True, "modalities": ["text"]}, "chat"),
    ],
)
def test_streamed_generation_requests_are_asked_as_codec(
    path: str, body: dict[str, Any], endpoint: str
) -> None:
    result = ask(body, path)
    assert isinstance(result, CodecAsk)
    assert result.endpoint == endpoint
    assert orjson.loads(result.body) == {**body, "stream_format": "protobuf"}


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/v1/embeddings", {"input": "a", "stream": True}, "not a generation request"),
        ("/v1/completions/codec", {"stream": True}, "not a generation request"),
        ("/v1/chat/completions", b"{", "not a JSON body"),
        ("/v1/chat/completions", [1], "not a JSON object"),
        ("/v1/chat/completions", {"messages": MESSAGES}, "not streamed"),
        ("/v1/chat/completions", {"stream": "yes"}, "not streamed"),
        (
            "/v1/chat/completions",
            {"stream": True, "stream_format": "json"},
            "stream_format already chosen",
        ),
        ("/v1/chat/completions", {"stream": True, "n": 2}, "more than one choice"),
        ("/v1/completions", {"stream": True, "prompt": "a", "best_of": 3}, "more than one choice"),
        ("/v1/completions", {"stream": True, "prompt": "a", "logprobs": 0}, "logprobs or echo"),
        ("/v1/completions", {"stream": True, "prompt": "a", "echo": True}, "logprobs or echo"),
        ("/v1/completions", {"stream": True, "prompt": ["a"]}, "not one prompt"),
        ("/v1/completions", {"stream": True, "prompt": [[1], [2]]}, "not one prompt"),
        ("/v1/completions", {"stream": True, "prompt": [1, True]}, "not one prompt"),
        ("/v1/completions", {"stream": True}, "not one prompt"),
        ("/v1/chat/completions", {"stream": True, "logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {"stream": True, "top_logprobs": 0}, "logprobs"),
        ("/v1/chat/completions", {"stream": True, "audio": {"voice": "x"}}, "not text only"),
        ("/v1/chat/completions", {"stream": True, "modalities": ["audio"]}, "not text only"),
    ],
)
def test_what_frames_cannot_carry_passes_through(path: str, body: Any, reason: str) -> None:
    assert ask(body, path) == reason


@pytest.mark.parametrize("stream", [False, None])
def test_a_caller_that_renders_whole_answers_asks_them_as_streams(stream: bool | None) -> None:
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream_options": {"x": 1}}
    if stream is not None:
        body["stream"] = stream
    assert ask(body) == "not streamed"  # the SDK transport's rule
    result = codec_ask_for("chat", body, stream_format="msgpack", whole=True)
    assert isinstance(result, CodecAsk)
    assert not result.streamed
    assert not result.include_usage  # a whole answer always has its usage
    assert orjson.loads(result.body) == {**body, "stream": True, "stream_format": "msgpack"}
    assert "stream_format" not in body  # the caller's document is left as it was
    streamed = codec_ask_for("chat", {**body, "stream": True}, stream_format="msgpack", whole=True)
    assert isinstance(streamed, CodecAsk)
    assert streamed.streamed
    # Whole or not, what frames cannot carry is not asked.
    assert codec_ask_for("chat", {**body, "n": 3}, stream_format="msgpack", whole=True) == (
        "more than one choice"
    )
    assert codec_ask_for("chat", {**body, "stream": 1}, stream_format="msgpack", whole=True) == (
        "not streamed"
    )


def test_only_posts_are_generation_requests() -> None:
    assert ask({"stream": True}, method="GET") == "not a generation request"


def test_stop_strings_usage_and_the_model_are_kept() -> None:
    result = ask(
        {
            "model": "smollm2",
            "messages": MESSAGES,
            "stream": True,
            "stop": ["\n\n", 5, "END"],
            "stream_options": {"include_usage": True},
        }
    )
    assert isinstance(result, CodecAsk)
    assert (result.model, result.rules, result.include_usage) == (
        "smollm2",
        TextRules(stop=("\n\n", "END")),
        True,
    )
    single = ask({"prompt": "a", "stream": True, "stop": "x"}, "/v1/completions")
    assert isinstance(single, CodecAsk)
    assert (single.rules.stop, single.model, single.include_usage) == (("x",), "", False)
    kept = ask({"messages": [], "stream": True, "stop": "x", "include_stop_str_in_output": True})
    assert isinstance(kept, CodecAsk)
    assert kept.rules.stop == ()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
KEYS = [
    "stream",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "echo",
    "prompt",
    "messages",
    "stop",
    "stream_options",
    "audio",
    "modalities",
    "model",
    "stream_format",
]


@given(
    body=st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), json_values, max_size=8),
    chat=st.booleans(),
)
def test_any_body_is_asked_unchanged_or_passes_through(body: dict[str, Any], chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    result = ask(body, path)
    if isinstance(result, str):
        return
    assert body["stream"] is True
    assert "stream_format" not in body
    assert orjson.loads(result.body) == {**body, "stream_format": "protobuf"}


def test_the_refusals_docs_rollout_names() -> None:
    refused = json.dumps({"error": {"code": "codec_not_enabled", "type": "x"}}).encode()
    assert fallback_for(403, {}, refused) == Fallback("codec_not_enabled", 300.0)
    assert fallback_for(403, {}, b'{"error": {"code": "forbidden"}}') is None
    assert fallback_for(403, {}, b"not json") is None
    upgrade = json.dumps({"error": "codec_version_required", "minimum_version": "0.6"}).encode()
    assert fallback_for(426, {}, upgrade, remember_seconds=9) == Fallback(
        "codec_version_required", 9
    )
    assert fallback_for(426, {}, b"") == Fallback("codec_version_required", 300.0)
    mismatch = b'{"error": {"code": "verification_mismatch"}}'
    assert fallback_for(503, {"retry-after": "42"}, mismatch) == Fallback(
        "verification_mismatch", 42.0
    )
    for retry_after in ("soon", "-1", "nan", "inf"):
        assert fallback_for(503, {"retry-after": retry_after}, mismatch) == Fallback(
            "verification_mismatch", 300.0
        )
    drift = b'{"error": {"code": "tokenizer_mismatch"}}'
    assert fallback_for(503, {}, drift) == Fallback("tokenizer_mismatch", 300.0)
    assert fallback_for(503, {}, b'{"error": {"code": "overloaded"}}') is None
    for status in (400, 401, 404, 429, 500, 502):
        assert status not in REFUSAL_STATUSES
        assert fallback_for(status, {}, refused) is None


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [("protobuf", "application/x-protobuf"), ("msgpack", "application/x-msgpack")],
)
def test_the_headers_that_ask_for_codec(fmt: str, media_type: str) -> None:
    assert codec_headers(fmt, "gzip") == (
        ("Accept", media_type),
        ("Accept-Encoding", "gzip"),
        ("Codec-Client-Version", CLIENT_VERSION),
    )


def test_a_refusal_is_remembered_for_its_time_per_origin_and_model() -> None:
    memory = RefusalMemory()
    key = ("http://proxy:8080", "smollm2")
    assert not memory.refused(key, 0.0)
    memory.remember(key, 100.0, 60.0)
    assert memory.refused(key, 159.9)
    assert not memory.refused(("http://proxy:8080", "other"), 120.0)
    assert not memory.refused(("http://other:8080", "smollm2"), 120.0)
    assert not memory.refused(key, 160.0)
    assert not memory.refused(key, 120.0)  # forgotten once expired
