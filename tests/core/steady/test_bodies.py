"""The native step's binding to response bodies, sans IO: which bodies it serves, the spelling
mask it is given, and a Codec body's steady reads through the step against the same reads
through the Python body, counters folded back. (Through a real upstream connection, split
and damaged at random: tests/server/test_native_differential.py.)"""

from __future__ import annotations

import pytest

from proxy.core.bodies import CodecBody, RelayedBody, verified_codec_body
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter
from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.flush import FlushConfig
from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4
from proxy.core.steady import NATIVE
from proxy.core.steady.bodies import NativeCodec, NativeRelay, native_body, unspellable_lead_bytes
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.token_source import ReportedIds, RetokenizedIds, TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import encoder_for
from proxy.maps.publish import publish
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import load_capture

pytestmark = pytest.mark.skipif(NATIVE is None, reason="built without the native steady path")

CAPTURE = "vllm-completions-token-ids.txt"
INF = float("inf")


def parts(
    vocabulary: Vocabulary,
    coding: str = "identity",
    fmt: str = "msgpack",
    token_ids: TokenIdMode = "auto",
) -> tuple[CodecTranscoder, StreamGuard, BodyWriter]:
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_completion_chunk,
        token_ids=token_ids,
        token_bytes=vocabulary.token_bytes,
    )
    flush = IDENTITY_FLUSH if coding == "identity" else FlushConfig(50, 16)
    writer = BodyWriter(encoder_for(fmt), new_compressor(coding, None), flush)  # type: ignore[arg-type]
    return transcoder, StreamGuard(transcoder, V0_4), writer


def test_the_step_serves_relayed_and_backend_id_codec_bodies(
    smollm2_vocabulary: Vocabulary,
) -> None:
    assert isinstance(native_body(RelayedBody()), NativeRelay)
    _, guard, writer = parts(smollm2_vocabulary)
    plain = native_body(CodecBody(guard, writer))
    assert isinstance(plain, NativeCodec)
    assert not plain.hands  # identity: the step frames and writes
    _, guard, writer = parts(smollm2_vocabulary, "gzip")
    compressed = native_body(CodecBody(guard, writer))
    assert isinstance(compressed, NativeCodec)
    assert compressed.hands  # the writer keeps its flush schedule and compressor


def test_a_verified_body_is_the_python_paths(smollm2_vocabulary: Vocabulary) -> None:
    transcoder, guard, writer = parts(smollm2_vocabulary)
    published = publish(
        smollm2_vocabulary.loaded, "test/smollm2", content=smollm2_vocabulary.map_content
    )
    decoder = MapDecoder.from_map(published.body)
    assert native_body(verified_codec_body(transcoder, guard, writer, decoder)) is None


def test_the_spelling_mask_agrees_with_the_scheme(smollm2_vocabulary: Vocabulary) -> None:
    scheme = smollm2_vocabulary.scheme
    mask = unspellable_lead_bytes(scheme)
    # SmolLM2 has no token for 0x16 or 0xF1 (proxy/core/stream/retokenizer.py).
    assert mask[0x16]
    assert mask[0xF1]
    for code in [*range(0, 0x3000, 7), *range(0x3000, 0x110000, 4099)]:
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        unspellable = scheme.spellable_prefix(char) == 0
        assert bool(mask[char.encode()[0]]) == unspellable, hex(code)


@pytest.mark.parametrize(
    ("coding", "fmt", "token_ids"),
    [("identity", "msgpack", "auto"), ("identity", "msgpack-delta", "auto"),
     ("identity", "protobuf", "auto"), ("gzip", "msgpack", "auto"),
     ("identity", "msgpack", "retokenize"), ("gzip", "msgpack-delta", "retokenize")],
)  # fmt: skip
def test_steady_reads_through_the_step_fold_back_into_the_body(
    smollm2_vocabulary: Vocabulary, coding: str, fmt: str, token_ids: TokenIdMode
) -> None:
    events = load_capture(CAPTURE).events
    reference_parts = parts(smollm2_vocabulary, coding, fmt, token_ids)
    reference = CodecBody(reference_parts[1], reference_parts[2])
    expected = [reference.feed(event, 0.0) for event in events]
    expected.append(reference.flush(0.0))

    transcoder, guard, writer = parts(smollm2_vocabulary, coding, fmt, token_ids)
    body = CodecBody(guard, writer)
    binding = native_body(body)
    assert binding is not None
    step = NATIVE.Step()  # type: ignore[union-attr]
    got, first = [], 0
    while not body.ready:  # the first frame is the Python path's
        got.append(body.feed(events[first], 0.0))
        first += 1
    assert binding.arm(step, 0.0, lambda: 0.0, (INF,))
    handed: list[bytes] = []
    for event in events[first:-3]:  # the finish, usage and [DONE] are not steady
        out = step.feed(b"%x\r\n%b\r\n" % (len(event), event))
        if binding.hands:
            assert isinstance(out, tuple | str)
            handed.append(binding.made(out, 0.0))
        else:
            assert isinstance(out, bytes)
            handed.append(out[out.index(b"\r\n") + 2 : -2] if out else b"")
    got += handed
    assert step.steady_reads == len(events) - 3 - first
    binding.fold(step)
    for event in events[-3:]:
        assert step.feed(b"%x\r\n%b\r\n" % (len(event), event)) is None  # declined ...
        assert step.body == event  # ... whole, and nothing changed
        got.append(body.feed(event, 0.0))
    got.append(body.flush(0.0))
    assert b"".join(got) == b"".join(expected)
    assert guard.outcome == reference.guard.outcome
    assert transcoder.tokens == reference_parts[0].tokens
    source, reference_source = transcoder._source, reference_parts[0]._source
    if token_ids == "retokenize":
        assert isinstance(source, RetokenizedIds)
        return
    assert isinstance(source, ReportedIds)
    assert isinstance(reference_source, ReportedIds)
    assert source._ids._base == reference_source._ids._base
