"""A Codec body's bytes, as they come over the wire, rendered at every split point: every wire
format, every content coding the proxy sends; and a body that breaks ends in an error event."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.decompressors import new_decompressor
from proxy.core.render.body import RenderedBody
from proxy.core.render.openai import Envelope, SseRenderer
from proxy.core.render.turn import TextRules
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.tokenizers.vocabulary import Vocabulary
from tests.compression_support import CODINGS, shipped_dictionaries
from tests.core.render.support import TOOL_CALLS, transcoded

ENVELOPE = Envelope("chat", "chatcmpl-1", 1, "smollm2")
RULES = TextRules(backend_ids=True)
DICTIONARIES = shipped_dictionaries()
# A stream with calls and a stream with characters split across IDs.
CAPTURES = (TOOL_CALLS, "llamacpp-chat-emoji-logprobs.txt")
FORMATS = ("msgpack", "msgpack-delta", "protobuf")


def dictionary_bytes(fmt: str, coding: str) -> bytes | None:
    if coding != "zstd":
        return None
    loaded = DICTIONARIES.for_format("protobuf" if fmt == "protobuf" else "msgpack")
    assert loaded is not None
    return loaded.data


def wire(frames: list[Frame], fmt: str, coding: str) -> bytes:
    """The body the proxy sends: each frame encoded, compressed, sync-flushed."""
    encoder = encoder_for(fmt)
    dictionary = dictionary_bytes(fmt, coding)
    loaded = DICTIONARIES.by_hex(hashlib.sha256(dictionary).hexdigest()) if dictionary else None
    compressor = new_compressor(coding, loaded)  # type: ignore[arg-type]
    body = b"".join(compressor.feed(encoder.encode(f)) + compressor.sync() for f in frames)
    return body + compressor.flush()


def body_for(decoder: MapDecoder, fmt: str, coding: str) -> RenderedBody:
    renderer = SseRenderer(decoder, ENVELOPE, rules=RULES)
    decompressor = new_decompressor(coding, dictionary_bytes(fmt, coding))
    return RenderedBody(renderer, fmt, decompressor)  # type: ignore[arg-type]


def summary(sse: bytes) -> dict[str, Any]:
    """What an OpenAI client reads from an SSE body: the text, the calls, how it ended."""
    out: dict[str, Any] = {"text": "", "calls": [], "finish": None, "error": None, "done": 0}
    for event in sse.split(b"\n\n"):
        if not event:
            continue
        data = event.removeprefix(b"data: ")
        if data == b"[DONE]":
            out["done"] += 1
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            out["error"] = chunk["error"]["message"]
            continue
        for choice in chunk["choices"]:
            out["text"] += choice["delta"].get("content") or ""
            out["calls"] += choice["delta"].get("tool_calls") or []
            out["finish"] = choice["finish_reason"] or out["finish"]
    return out


def frames_of(vocabulary: Vocabulary, name: str) -> list[Frame]:
    return [frame for batch in transcoded(vocabulary, name, "auto") for frame in batch]


def direct(decoder: MapDecoder, frames: list[Frame]) -> dict[str, Any]:
    renderer = SseRenderer(decoder, ENVELOPE, rules=RULES)
    return summary(renderer.feed(frames) + renderer.flush())


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", CODINGS)
def test_every_split_point_renders_as_the_frames_themselves(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary, name: str, fmt: str, coding: str
) -> None:
    frames = frames_of(smollm2_vocabulary, name)
    expected = direct(smollm2_map, frames)
    assert expected["done"] == 1
    assert expected["error"] is None
    body = wire(frames, fmt, coding)
    for cut in range(len(body) + 1):
        rendered = body_for(smollm2_map, fmt, coding)
        sse = rendered.feed(body[:cut]) + rendered.feed(body[cut:]) + rendered.flush()
        assert summary(sse) == expected, cut
        assert rendered.wire_bytes == len(body)
        assert rendered.tokens == sum(len(frame.ids) for frame in frames)
        assert rendered.done


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=25)
@given(cuts=st.lists(st.integers(0, 4000), max_size=30), fmt=st.sampled_from(FORMATS))
def test_any_reads_render_the_same(
    smollm2_map: MapDecoder,
    smollm2_vocabulary: Vocabulary,
    coding: str,
    cuts: list[int],
    fmt: str,
) -> None:
    frames = frames_of(smollm2_vocabulary, "llamacpp-chat-emoji-logprobs.txt")
    body = wire(frames, fmt, coding)
    edges = [0, *sorted({min(cut, len(body)) for cut in cuts}), len(body)]
    rendered = body_for(smollm2_map, fmt, coding)
    sse = b"".join(rendered.feed(body[a:b]) for a, b in itertools.pairwise(edges))
    assert summary(sse + rendered.flush()) == direct(smollm2_map, frames)


def test_a_body_cut_short_ends_with_an_error_after_its_text(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    frames = frames_of(smollm2_vocabulary, TOOL_CALLS)
    for coding, message in [("identity", "ended mid-frame"), ("br", "cut before its end")]:
        body = wire(frames, "msgpack", coding)
        rendered = body_for(smollm2_map, "msgpack", coding)
        read = summary(rendered.feed(body[: len(body) - 20]) + rendered.flush())
        assert read["error"] is not None
        assert message in read["error"]
        assert (read["text"], read["done"]) == ("Let me check.", 1)
    # A coding's own end (gzip's trailer) cut after the terminal frame: the answer is whole.
    body = wire(frames, "msgpack", "gzip")
    rendered = body_for(smollm2_map, "msgpack", "gzip")
    sse = rendered.feed(body[:-3]) + rendered.flush()
    assert summary(sse) == direct(smollm2_map, frames)
    rendered = body_for(smollm2_map, "msgpack", "identity")
    first = wire(frames[:1], "msgpack", "identity")
    read = summary(rendered.feed(first) + rendered.flush())
    assert (read["text"], read["error"]) == (
        "Let me check.",
        "the Codec stream ended before its terminal frame",
    )


def test_bytes_that_do_not_decode_end_the_answer(smollm2_map: MapDecoder) -> None:
    rendered = body_for(smollm2_map, "msgpack", "gzip")
    read = summary(rendered.feed(b"not gzip at all"))
    assert read["error"] is not None
    assert "not valid gzip" in read["error"]
    assert rendered.done
    assert rendered.feed(b"more") == rendered.flush() == b""
    rendered = body_for(smollm2_map, "protobuf", "identity")
    read = summary(rendered.feed(b"\x00\x00\x00\x02\xff\xff"))
    assert read["error"] is not None
    assert read["done"] == 1


def test_what_follows_the_terminal_frame_is_not_read(
    smollm2_map: MapDecoder, smollm2_vocabulary: Vocabulary
) -> None:
    frames = frames_of(smollm2_vocabulary, TOOL_CALLS)
    body = wire(frames, "msgpack", "identity")
    rendered = body_for(smollm2_map, "msgpack", "identity")
    sse = rendered.feed(body)
    assert rendered.feed(b"garbage") == rendered.flush() == b""
    assert summary(sse) == direct(smollm2_map, frames)
    assert rendered.wire_bytes == len(body) + len(b"garbage")


def test_a_failure_from_outside(smollm2_map: MapDecoder) -> None:
    rendered = body_for(smollm2_map, "msgpack", "identity")
    read = summary(rendered.fail("connection reset"))
    assert read["error"] == "connection reset"


def test_an_id_past_the_map_ends_the_answer_as_map_drift(smollm2_map: MapDecoder) -> None:
    rendered = body_for(smollm2_map, "protobuf", "identity")
    frames = [Frame((1, 2)), Frame((smollm2_map.vocab_size,)), Frame((), True, "length")]
    read = summary(rendered.feed(wire(frames, "protobuf", "identity")))
    assert read["error"] is not None
    assert "follow another map" in read["error"]
    assert read["finish"] is None
    assert rendered.done
    assert rendered.map_drift
    fine = body_for(smollm2_map, "protobuf", "identity")
    fine.feed(wire([Frame((1, 2), True, "length")], "protobuf", "identity"))
    assert fine.done
    assert not fine.map_drift
