"""What the head of an answer to a Codec request says, and the body the plan assembles for it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.client.answer import (
    Failed,
    Frames,
    NotFrames,
    Unrenderable,
    backend_ids,
    envelope_for,
    frame_format,
    read_answer,
)
from proxy.core.client.ask import CodecAsk, codec_ask_for
from proxy.core.render.openai import CompletionRenderer, SseRenderer
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.decoder import DEFAULT_MAX_FRAME_BYTES
from proxy.core.wire.frames import Frame, encoder_for

DIGEST = "ab" * 32
DICTIONARY = "cd" * 32
FRAMES_HEAD = {
    "Content-Type": "application/x-protobuf",
    "Codec-Tokenizer-Map": f"test/smollm2 sha256:{DIGEST}",
    "Codec-Token-Source": "backend",
}


def ask_of(endpoint: str, **fields: Any) -> CodecAsk:
    document: dict[str, Any] = {"model": "smollm2", **fields}
    if endpoint == "chat":
        document.setdefault("messages", [{"role": "user", "content": "Hi"}])
    else:
        document.setdefault("prompt", "Hi")
    ask = codec_ask_for(endpoint, document, stream_format="protobuf", whole=True)  # type: ignore[arg-type]
    assert isinstance(ask, CodecAsk)
    return ask


@pytest.mark.parametrize(
    "wrap",
    [
        lambda fields: httpx.Headers(fields),
        lambda fields: CIMultiDictProxy(CIMultiDict(fields)),
    ],
    ids=["httpx", "aiohttp"],
)
def test_frames_name_what_rendering_them_takes(wrap: Any) -> None:
    answer = read_answer(200, wrap(FRAMES_HEAD))
    assert answer == Frames("protobuf", DIGEST, None, None, "backend")
    zstd = {**FRAMES_HEAD, "Content-Encoding": "zstd", "Codec-Zstd-Dict": f"sha256:{DICTIONARY}"}
    assert read_answer(200, wrap(zstd)) == Frames("protobuf", DIGEST, DICTIONARY, "zstd", "backend")


def test_frames_naming_no_map_or_no_dictionary_cannot_be_rendered() -> None:
    no_map = {k: v for k, v in FRAMES_HEAD.items() if k != "Codec-Tokenizer-Map"}
    answer = read_answer(200, httpx.Headers(no_map))
    assert isinstance(answer, Unrenderable)
    assert answer.reason == "no_tokenizer_map"
    zstd = {**FRAMES_HEAD, "Content-Encoding": "zstd", "Codec-Zstd-Dict": "sha256:short"}
    answer = read_answer(200, httpx.Headers(zstd))
    assert isinstance(answer, Unrenderable)
    assert answer.reason == "no_zstd_dictionary"


def test_a_200_that_is_not_codec() -> None:
    answer = read_answer(200, httpx.Headers({"Content-Type": "text/event-stream"}))
    assert isinstance(answer, NotFrames)
    assert answer.reason == "not_codec"


@pytest.mark.parametrize(
    ("status", "may_be_refusal"),
    [(403, True), (426, True), (503, True), (400, False), (404, False), (500, False)],
)
def test_errors_and_which_may_be_a_refusal(status: int, may_be_refusal: bool) -> None:
    answer = read_answer(status, httpx.Headers(FRAMES_HEAD))
    assert answer == Failed(status)
    assert isinstance(answer, Failed)
    assert answer.may_be_refusal is may_be_refusal


@pytest.mark.parametrize(
    ("content_type", "header", "expected"),
    [
        ("application/x-msgpack", None, "msgpack"),
        ("application/x-protobuf", None, "protobuf"),
        ("Application/X-Protobuf; charset=binary", None, "protobuf"),
        ("application/x-msgpack", "msgpack-delta", "msgpack-delta"),
        ("application/x-protobuf", " Protobuf ", "protobuf"),
        ("application/codec+msgpack", None, None),
        ("text/event-stream", None, None),
        ("application/json", None, None),
        (None, None, None),
        ("application/x-msgpack", "protobuf-delta", None),
    ],
)
def test_the_format_a_response_names(
    content_type: str | None, header: str | None, expected: str | None
) -> None:
    assert frame_format(content_type, header) == expected


def test_the_envelope_is_the_clients() -> None:
    chat = envelope_for(ask_of("chat"), "abc", 5)
    assert (chat.id, chat.created, chat.model, chat.chat) == ("chatcmpl-abc", 5, "smollm2", True)
    assert envelope_for(ask_of("completions"), "abc", 5).id == "cmpl-abc"


@pytest.mark.parametrize(
    ("header", "backend"),
    [("backend", True), (" Backend ", True), ("retokenized", False), (None, False)],
)
def test_the_token_source_the_answer_names(header: str | None, backend: bool) -> None:
    assert backend_ids(header) is backend


def test_the_body_renders_as_the_client_asked(smollm2_map: MapDecoder) -> None:
    answer = Frames("protobuf", DIGEST, None, None, None)
    streamed = answer.body(
        ask_of("chat", stream=True), smollm2_map, None, request_id="r", created=1
    )
    assert isinstance(streamed.renderer, SseRenderer)
    whole = answer.body(ask_of("completions"), smollm2_map, None, request_id="r", created=1)
    assert isinstance(whole.renderer, CompletionRenderer)
    hello = smollm2_map.table.index(b"Hello")
    frames = [Frame((hello,)), Frame((), True, "length")]
    data = b"".join(encoder_for("protobuf").encode(frame) for frame in frames)
    rendered = json.loads(whole.feed(data))
    assert rendered["id"] == "cmpl-r"
    assert rendered["choices"][0]["finish_reason"] == "length"
    assert rendered["choices"][0]["text"] == "Hello"


def test_the_body_refuses_a_frame_past_the_drafts_cap(smollm2_map: MapDecoder) -> None:
    answer = Frames("protobuf", DIGEST, None, None, None)
    body = answer.body(ask_of("completions"), smollm2_map, None, request_id="r", created=1)
    prefix = (DEFAULT_MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    error = json.loads(body.feed(prefix))["error"]["message"]
    assert f"exceeds the {DEFAULT_MAX_FRAME_BYTES}-byte limit" in error
