"""The three response bodies, driven the way the edge's pump drives them."""

from __future__ import annotations

import pytest

from proxy.core.bodies import CodecBody, RelayedBody
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter
from proxy.core.compression.compressors import new_compressor
from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.tokenizers.vocabulary import Vocabulary
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
