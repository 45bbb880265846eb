"""The response bodies, driven the way the edge's pump drives them; a Codec body verified."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.core.bodies import (
    CodecBody,
    CompressedEventsBody,
    CompressedWholeBody,
    RelayedBody,
    ResponseBody,
    verified_codec_body,
)
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter
from proxy.core.compression.compressors import new_compressor, plain_compressor
from proxy.core.compression.event_writer import EventWriter
from proxy.core.compression.flush import FlushConfig
from proxy.core.guard import StreamGuard
from proxy.core.http.content_coding import ContentCoding
from proxy.core.http.versioning import V0_4
from proxy.core.safety.rules import Vocab
from proxy.core.safety.stream import PolicedIds
from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.token_source import TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.verify.verifier import Verification
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.maps.publish import publish
from proxy.tokenizers.vocabulary import Vocabulary
from tests.compression_support import decompress_whole, incremental_decompressor
from tests.core.safety.support import compiled
from tests.fake_upstream import load_capture

SAMPLE = load_capture("llamacpp-completions-sample.txt").body


def codec_body(vocabulary: Vocabulary) -> CodecBody:
    transcoder = CodecTranscoder(vocabulary.scheme, parse_completion_chunk)
    writer = BodyWriter(encoder_for("msgpack"), new_compressor("identity", None), IDENTITY_FLUSH)
    return CodecBody(StreamGuard(transcoder, V0_4), writer)


def decoded(body: bytes) -> list[Frame]:
    decoder = FrameDecoder("msgpack")
    frames = decoder.feed(body)
    decoder.flush()
    assert decoder.finished
    return frames


def test_relayed_body_is_the_upstream_bytes_and_cannot_end_cleanly_on_failure() -> None:
    body = RelayedBody()
    assert body.feed(b"abc", 0.0) == b"abc"
    assert body.ready
    assert not body.done
    assert body.deadline() is None
    assert body.fail("gone", 1.0) is None  # the edge must close the connection


def test_relayed_empty_body_is_ready_at_its_end() -> None:
    body = RelayedBody()
    assert not body.ready
    assert body.flush(0.0) == b""
    assert body.ready


@pytest.mark.parametrize("step", [1, 7, 64, len(SAMPLE)])
def test_codec_body_is_ready_with_its_first_frame_and_ends_once(
    smollm2_vocabulary: Vocabulary, step: int
) -> None:
    body = codec_body(smollm2_vocabulary)
    out = b""
    for start in range(0, len(SAMPLE), step):
        out += body.feed(SAMPLE[start : start + step], float(start))
        # Ready exactly when there is something to send: the headers wait for the first frame.
        assert body.ready == bool(out)
    out += body.flush(float(len(SAMPLE)))
    frames = decoded(out)
    assert [frame.done for frame in frames].count(True) == 1
    assert frames[-1].done
    assert body.done


def test_codec_body_failing_mid_stream_ends_with_one_terminal_frame(
    smollm2_vocabulary: Vocabulary,
) -> None:
    body = codec_body(smollm2_vocabulary)
    head = body.feed(SAMPLE[: len(SAMPLE) // 2], 0.0)
    ending = body.fail("upstream failed mid-stream", 1.0)
    assert ending is not None
    frames = decoded(head + ending)
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert [frame.done for frame in frames].count(True) == 1


# --- a sampled stream, verified as it is served (proxy/core/verify/) -------------------------

VERIFIED_CAPTURES = [
    ("llamacpp-completions-sample.txt", False),
    ("llamacpp-completions-logprobs.txt", False),
    ("llamacpp-completions-emoji-logprobs.txt", False),
    ("llamacpp-completions-cut-utf8-logprobs.txt", False),
    ("llamacpp-completions-eos-logprobs.txt", False),
    ("llamacpp-completions-stop-holdback-logprobs.txt", False),
    ("llamacpp-chat-emoji-logprobs.txt", True),
    ("vllm-completions-sample.txt", False),
    ("vllm-completions-token-ids.txt", False),
    ("vllm-completions-stop-sequence.txt", False),
    ("vllm-chat.txt", True),
    ("vllm-chat-tool-calls-synthetic.txt", True),
    ("vllm-chat-reasoning-synthetic.txt", True),
]


@pytest.fixture(scope="module")
def smollm2_map(smollm2_vocabulary: Vocabulary) -> bytes:
    """SmolLM2's map, the bytes a client downloads."""
    content = smollm2_vocabulary.map_content
    return publish(smollm2_vocabulary.loaded, "test/smollm2", content=content).body


def verified_body(
    vocabulary: Vocabulary,
    decoder: MapDecoder | None,
    *,
    mode: TokenIdMode = "retokenize",
    chat: bool = False,
    policed: PolicedIds | None = None,
) -> CodecBody:
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if chat else parse_completion_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )
    writer = BodyWriter(encoder_for("msgpack"), new_compressor("identity", None), IDENTITY_FLUSH)
    return verified_codec_body(transcoder, StreamGuard(transcoder, V0_4, policed), writer, decoder)


def pump(body: CodecBody, data: bytes, step: int | None = None) -> list[Frame]:
    step = step or len(data) or 1
    out = b""
    for start in range(0, len(data), step):
        out += body.feed(data[start : start + step], float(start))
        if body.done:
            break
    out += body.flush(float(len(data)))
    return decoded(out)


def sent_ids(frames: list[Frame]) -> list[int]:
    return [token_id for frame in frames for token_id in frame.ids]


@pytest.mark.parametrize("step", [1, 29, None])
@pytest.mark.parametrize("mode", ["retokenize", "auto"])
@pytest.mark.parametrize(("name", "chat"), VERIFIED_CAPTURES)
def test_a_captured_stream_verifies(
    smollm2_vocabulary: Vocabulary,
    smollm2_map: bytes,
    name: str,
    chat: bool,
    mode: TokenIdMode,
    step: int | None,
) -> None:
    capture = load_capture(name)
    body = verified_body(smollm2_vocabulary, MapDecoder.from_map(smollm2_map), mode=mode, chat=chat)
    frames = pump(body, capture.body, step)
    text = capture.stream_text(chat=chat).encode()
    assert body.verification == Verification(True, None, len(text))
    assert frames[-1].done
    if mode == "auto" and b'token_ids":[' in capture.body:
        assert body.guard.token_source == "backend"


def first_difference(decoder: MapDecoder, text: bytes, ids: list[int]) -> int:
    rendered = b"".join(piece or b"" for piece in map(decoder.piece, ids))
    return next(i for i, (a, b) in enumerate(zip(rendered, text, strict=False)) if a != b)


def test_a_map_that_lies_about_one_token_is_caught(
    smollm2_vocabulary: Vocabulary, smollm2_map: bytes
) -> None:
    # The map a client downloads swaps two tokens' IDs (built from another vocabulary's
    # order, say): the tokenizer that makes the IDs is right, the client decodes them wrong.
    document = orjson.loads(smollm2_map)
    vocab = document["vocab"]
    vocab["Ġthe"], vocab["Ġcity"] = vocab["Ġcity"], vocab["Ġthe"]
    lying = MapDecoder.from_map(orjson.dumps(document))
    capture = load_capture("llamacpp-completions-sample.txt")
    body = verified_body(smollm2_vocabulary, lying)
    frames = pump(body, capture.body, 64)
    text = capture.stream_text().encode()
    at = first_difference(lying, text, sent_ids(frames))
    assert text[at - 1 : at + 3] == b" the"  # ", the city of New Haven ..."
    assert body.verification == Verification(False, at, at)
    # The same stream, the true map: the frames were right all along.
    honest = verified_body(smollm2_vocabulary, MapDecoder.from_map(smollm2_map))
    assert sent_ids(pump(honest, capture.body, 64)) == sent_ids(frames)
    assert honest.verification == Verification(True, None, len(text))


def test_a_map_that_forgets_a_special_token_is_caught(
    smollm2_vocabulary: Vocabulary, smollm2_map: bytes
) -> None:
    # `<|im_end|>` left out of special_tokens: a client renders its text after the answer.
    document = orjson.loads(smollm2_map)
    del document["special_tokens"]["<|im_end|>"]
    forgetful = MapDecoder.from_map(orjson.dumps(document))
    capture = load_capture("llamacpp-completions-eos-logprobs.txt")
    text = capture.stream_text().encode()
    body = verified_body(smollm2_vocabulary, forgetful, mode="backend")
    frames = pump(body, capture.body)
    assert sent_ids(frames)[-1] == 2
    assert body.verification == Verification(False, len(text), len(text))
    # Retokenized, the end-of-turn token is never sent: nothing to catch.
    retokenized = verified_body(smollm2_vocabulary, forgetful)
    pump(retokenized, capture.body)
    assert retokenized.verification == Verification(True, None, len(text))


def test_a_stream_not_sampled_is_not_verified(smollm2_vocabulary: Vocabulary) -> None:
    body = verified_body(smollm2_vocabulary, None)
    pump(body, SAMPLE)
    assert body.verification is None
    assert body.guard.source.on_text is None  # type: ignore[attr-defined]


def test_a_stream_failing_mid_way_is_verified_up_to_there(
    smollm2_vocabulary: Vocabulary, smollm2_map: bytes
) -> None:
    body = verified_body(smollm2_vocabulary, MapDecoder.from_map(smollm2_map))
    head = body.feed(SAMPLE[: len(SAMPLE) // 2], 0.0)
    ending = body.fail("upstream failed mid-stream", 1.0)
    assert ending is not None
    frames = decoded(head + ending)
    assert frames[-1].finish_reason == "error"
    verdict = body.verification
    assert verdict is not None
    assert verdict.agreed
    # Nothing after the one terminal frame counts.
    assert body.feed(SAMPLE[len(SAMPLE) // 2 :], 2.0) == b""
    assert body.flush(3.0) == b""
    assert body.verification is verdict


@pytest.mark.parametrize(
    ("rules", "verified"),
    [
        ({"stop_strings": ["a thriving metropolis"]}, False),  # stopped: its IDs withheld
        ({"redact_strings": ["New Haven"]}, False),  # a placeholder in place of the span
        ({"redact_strings": ["no such words anywhere"]}, True),  # policed, unchanged
    ],
)
def test_a_stream_the_policy_changed_is_not_judged(
    smollm2_vocabulary: Vocabulary, smollm2_map: bytes, rules: dict[str, Any], verified: bool
) -> None:
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    vocab = Vocab(
        size=smollm2_vocabulary.loaded.vocab_size,
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
    )
    policed = PolicedIds(compiled(vocab, **rules), tokenizer)
    decoder = MapDecoder.from_map(smollm2_map)
    body = verified_body(smollm2_vocabulary, decoder, policed=policed)
    pump(body, SAMPLE, 64)
    text = load_capture("llamacpp-completions-sample.txt").stream_text().encode()
    assert body.verification == (Verification(True, None, len(text)) if verified else None)


def test_the_factory_wires_one_verifier_to_the_right_transcoder(
    smollm2_vocabulary: Vocabulary, smollm2_map: bytes
) -> None:
    decoder = MapDecoder.from_map(smollm2_map)
    writer = BodyWriter(encoder_for("msgpack"), new_compressor("identity", None), IDENTITY_FLUSH)
    transcoder = CodecTranscoder(smollm2_vocabulary.scheme, parse_completion_chunk)
    other = CodecTranscoder(smollm2_vocabulary.scheme, parse_completion_chunk)
    with pytest.raises(ValueError, match="does not wrap"):
        verified_codec_body(transcoder, StreamGuard(other, V0_4), writer, decoder)
    guard = StreamGuard(transcoder, V0_4)
    verified_codec_body(transcoder, guard, writer, decoder)
    with pytest.raises(ValueError, match="already"):
        verified_codec_body(transcoder, guard, writer, decoder)


# --- compressed JSON: an event stream, a whole body ------------------------------------------

JSON_CODINGS: tuple[ContentCoding, ...] = ("gzip", "br", "zstd")
SHORT = load_capture("vllm-completions-stop-sequence.txt").body


def events_body(
    coding: ContentCoding,
    inner: RelayedBody | None = None,
    *,
    interval_ms: float = 50,
    max_held: int = 1 << 20,
) -> CompressedEventsBody:
    writer = EventWriter(plain_compressor(coding), FlushConfig(interval_ms, 32))
    return CompressedEventsBody(inner or RelayedBody(), writer, max_held=max_held)


def ready(body: ResponseBody) -> bool:
    """`body.ready` read afresh (an assert on the attribute would narrow it for mypy)."""
    return body.ready


def whole_events(data: bytes) -> bool:
    return not data or data.endswith((b"\n\n", b"\r\r", b"\r\n\r\n", b"\r\n\r"))


@pytest.mark.parametrize("coding", JSON_CODINGS)
@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_an_event_stream_split_anywhere_decodes_to_itself_whole_events_at_a_time(
    coding: ContentCoding, eol: bytes
) -> None:
    stream = SHORT.replace(b"\n", eol)
    for offset in range(len(stream) + 1):
        # Every event flushed: the most flush points, each of which must end an event.
        body = events_body(coding, interval_ms=0)
        decompress = incremental_decompressor(coding)
        assert not ready(body)
        wire = body.feed(stream[:offset], 0.0)
        seen = decompress(wire)
        assert whole_events(seen), offset
        assert ready(body) == bool(wire)
        wire2 = body.feed(stream[offset:], 0.01)
        seen += decompress(wire2)
        assert whole_events(seen), offset
        assert ready(body)
        assert not body.done
        end = body.flush(0.02)
        assert decompress_whole(coding, wire + wire2 + end) == stream, offset
        assert body.flush(0.03) == b""


@pytest.mark.parametrize("coding", JSON_CODINGS)
def test_an_event_stream_is_flushed_on_the_schedule(coding: ContentCoding) -> None:
    body = events_body(coding, interval_ms=50)
    decompress = incremental_decompressor(coding)
    events = [e + b"\n\n" for e in SHORT.split(b"\n\n")[:3]]
    assert decompress(body.feed(events[0], 0.0)) == events[0]  # the first at once
    assert ready(body)
    assert decompress(body.feed(events[1] + events[2][:10], 0.01)) == b""
    assert body.deadline() == pytest.approx(0.06)
    assert body.on_deadline(0.05) == b""
    deadline = body.deadline()
    assert deadline is not None
    # Due: the whole event goes, not the piece of the next one.
    assert decompress(body.on_deadline(deadline)) == events[1]
    assert body.deadline() is None
    assert decompress(body.feed(events[2][10:], 0.07)) == b""
    assert decompress(body.flush(0.08)) == events[2]


def test_an_unended_last_event_goes_out_as_the_upstream_sent_it() -> None:
    body = events_body("gzip")
    wire = body.feed(b"data: 1\n\ndata: 2", 0.0) + body.flush(0.1)
    assert decompress_whole("gzip", wire) == b"data: 1\n\ndata: 2"


def test_an_event_that_never_ends_is_not_held_without_bound() -> None:
    body = events_body("gzip", max_held=100)
    decompress = incremental_decompressor("gzip")
    assert decompress(body.feed(b"data: 1\n\n", 0.0)) == b"data: 1\n\n"
    body.feed(b"data: " + b"x" * 60, 0.1)
    assert body._held_bytes == 66
    body.feed(b"x" * 60, 0.2)  # past max_held: handed to the compressor, unflushed
    assert body._held_bytes == 0
    end = body.flush(0.3)
    assert decompress(end) == b"data: " + b"x" * 120


class Stopping(RelayedBody):
    """An inner body that a policy `stop` ends: its last bytes, then nothing."""

    __slots__ = ("stopped",)

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    @property
    def done(self) -> bool:
        return self.stopped

    def feed(self, chunk: bytes, now: float) -> bytes:
        if self.stopped:
            return b""
        self.stopped = b"STOP" in chunk
        return chunk


def test_an_inner_body_that_ends_ends_the_compressed_stream_in_the_same_feed() -> None:
    # The edge never calls `flush` on a body that is done: the compression must end there.
    body = events_body("gzip", Stopping())
    wire = body.feed(b"data: 1\n\n", 0.0) + body.feed(b"data: 2\n\ndata: STOP\n\n", 0.01)
    assert body.done
    assert ready(body)
    assert decompress_whole("gzip", wire) == b"data: 1\n\ndata: 2\n\ndata: STOP\n\n"
    assert body.feed(b"data: 3\n\n", 0.02) == b""
    assert body.flush(0.03) == b""


def test_a_failed_event_stream_is_not_ended_as_if_whole() -> None:
    body = events_body("gzip")
    body.feed(b"data: 1\n\n", 0.0)
    assert body.fail("gone", 0.1) is None


@pytest.mark.parametrize("coding", JSON_CODINGS)
def test_a_whole_body_split_anywhere_is_compressed_once_with_its_length(
    coding: ContentCoding,
) -> None:
    document = load_capture("llamacpp-models.txt").body
    for offset in range(len(document) + 1):
        body = CompressedWholeBody(plain_compressor(coding), max_buffered=1 << 20)
        assert body.feed(document[:offset], 0.0) == b""
        assert body.feed(document[offset:], 0.1) == b""
        assert not ready(body)
        assert body.deadline() is None
        wire = body.flush(0.2)
        assert ready(body)
        assert body.length == len(wire)
        assert decompress_whole(coding, wire) == document
        assert body.flush(0.3) == b""  # the edge may ask twice


def test_a_whole_body_that_outgrows_the_buffer_is_sent_on_without_a_length() -> None:
    noise = random.Random(0).randbytes(16 * 1024)  # incompressible: output comes early
    body = CompressedWholeBody(plain_compressor("gzip"), max_buffered=1024)
    wire = b""
    for _ in range(20):
        wire += body.feed(noise, 0.0)
        if body.ready:
            break
    assert ready(body)
    assert wire
    wire += body.feed(b'"}', 0.1) + body.flush(0.2)
    assert body.length is None
    assert body.fail("gone", 0.3) is None
    assert decompress_whole("gzip", wire).endswith(noise + b'"}')
