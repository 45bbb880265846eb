"""A Codec answer rendered for a JSON client as the data plane feeds it: when the response may
start, what the whole answer's status and length are, and that it reads as the frames do."""

from __future__ import annotations

import json
from typing import Any

from proxy.core.client.answer import Frames
from proxy.core.client.ask import CodecAsk, codec_ask_for
from proxy.core.render.response import RenderedResponseBody
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import Frame
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.render.support import TOOL_CALLS
from tests.core.render.test_body import frames_of, summary, wire

MESSAGES = [{"role": "user", "content": "Hi"}]


def ask_of(endpoint: str, **fields: Any) -> CodecAsk:
    document = {"model": "smollm2", **fields}
    if endpoint == "chat":
        document.setdefault("messages", MESSAGES)
    else:
        document.setdefault("prompt", "Hi")
    ask = codec_ask_for(endpoint, document, stream_format="protobuf", whole=True)  # type: ignore[arg-type]
    assert isinstance(ask, CodecAsk)
    return ask


def rendered_body(decoder: MapDecoder, ask: CodecAsk, coding: str = "gzip") -> RenderedResponseBody:
    answer = Frames("protobuf", "0" * 64, None, coding, "backend")
    return RenderedResponseBody(answer.body(ask, decoder, None, request_id="r1", created=7))


def is_ready(body: RenderedResponseBody) -> bool:
    """`body.ready` as of now (a property a type checker would take for fixed)."""
    return body.ready


def fed(body: RenderedResponseBody, data: bytes, step: int) -> list[bytes]:
    out = [body.feed(data[i : i + step], 0.0) for i in range(0, len(data), step)]
    return [*out, body.flush(0.0)]


def test_a_stream_starts_with_its_first_bytes_and_reads_as_the_frames(
    smollm2_vocabulary: Vocabulary, smollm2_map: MapDecoder
) -> None:
    frames = frames_of(smollm2_vocabulary, TOOL_CALLS)
    body = rendered_body(smollm2_map, ask_of("chat", stream=True))
    assert body.streamed
    assert not is_ready(body)
    out = fed(body, wire(frames, "protobuf", "gzip"), 7)
    first = next(i for i, part in enumerate(out) if part)
    assert body.done
    assert is_ready(body)
    assert body.size == sum(map(len, out))
    assert body.tokens == sum(len(frame.ids) for frame in frames)
    assert body.status == 200
    assert body.error is None
    read = summary(b"".join(out))
    assert read["finish"] == "tool_calls"
    assert [call["function"]["name"] for call in read["calls"]] == ["get_weather", "get_time"]
    assert read["done"] == 1
    assert first < len(out) - 1  # streamed as it came, not at the end


def test_a_whole_answer_is_ready_only_once_complete(
    smollm2_vocabulary: Vocabulary, smollm2_map: MapDecoder
) -> None:
    frames = frames_of(smollm2_vocabulary, TOOL_CALLS)
    body = rendered_body(smollm2_map, ask_of("chat"))
    assert not body.streamed
    data = wire(frames, "protobuf", "gzip")
    out = []
    for i in range(0, len(data), 5):
        out.append(body.feed(data[i : i + 5], 0.0))
        assert body.ready == body.done
    assert body.ready
    answer = json.loads(b"".join(out))
    assert body.size == len(b"".join(out))
    assert body.status == 200
    message = answer["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert answer["usage"]["completion_tokens"] == body.tokens > 0
    # Nothing more once complete: the coding's end is read and dropped.
    assert body.flush(0.0) == b""


def test_a_whole_answer_that_fails_is_an_error_with_a_status_saying_so(
    smollm2_map: MapDecoder,
) -> None:
    body = rendered_body(smollm2_map, ask_of("completions"), coding="identity")
    assert body.feed(wire([Frame((1, 2), False)], "protobuf", "identity"), 0.0) == b""
    assert not is_ready(body)
    out = body.flush(0.0)  # cut before its terminal frame
    assert is_ready(body)
    assert body.done
    assert body.status == 502
    assert body.error is not None
    assert json.loads(out)["error"]["message"] == body.error


def test_a_stream_that_fails_ends_with_the_error_event(smollm2_map: MapDecoder) -> None:
    body = rendered_body(smollm2_map, ask_of("completions", stream=True), coding="identity")
    body.feed(wire([Frame((1, 2), False)], "protobuf", "identity"), 0.0)
    ending = body.fail("upstream failed mid-stream: reset", 0.0)
    assert ending is not None
    assert summary_error(ending) == "upstream failed mid-stream: reset"
    assert body.status == 200  # a stream's status left with its first bytes


def summary_error(sse: bytes) -> str | None:
    for event in sse.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if data.startswith(b"{") and b'"error"' in data:
            return str(json.loads(data)["error"]["message"])
    return None


def test_usage_only_when_a_stream_asked_for_it(smollm2_map: MapDecoder) -> None:
    frames = [Frame((1, 2, 3), False), Frame((4,), True, "length")]
    for options, usage in (({"include_usage": True}, 4), ({}, None)):
        ask = ask_of("completions", stream=True, stream_options=options)
        body = rendered_body(smollm2_map, ask, coding="identity")
        out = b"".join(fed(body, wire(frames, "protobuf", "identity"), 64))
        chunks = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
        found = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
        assert found == ([] if usage is None else [usage])
