"""Path B request bodies (proxy/core/wire/codec_request.py): both encodings, every truncation point,
and fuzzing: anything but a valid `CodecRequest` is a 400 (or 415), never another exception."""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from proxy.core.wire import codec_pb2, protowire
from proxy.core.wire.codec_request import (
    DEFAULT_MAX_TOKENS,
    CodecRequestBody,
    decode_codec_request,
)
from proxy.core.wire.prompt_ids import PromptLimits

VOCAB = 49152
LIMITS = PromptLimits(VOCAB, 1000)
MSGPACK = "application/x-msgpack"
PROTOBUF = "application/x-protobuf"


def decode(body: bytes, content_type: str = PROTOBUF) -> CodecRequestBody:
    return decode_codec_request(body, content_type, LIMITS)


def proto(**fields: Any) -> bytes:
    return bytes(codec_pb2.CodecRequest(**fields).SerializeToString())


def prefixed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def packed(value: Any) -> bytes:
    return bytes(msgpack.packb(value))


# --- the two encodings ------------------------------------------------------------------------

FULL = CodecRequestBody((1, 2, 49151), 64, 0.5, ("\n\n", "stop"), "protobuf")


def test_protobuf_from_the_generated_class() -> None:
    body = proto(
        prompt_ids=[1, 2, 49151],
        max_tokens=64,
        temperature=0.5,
        stop=["\n\n", "stop"],
        stream_format="protobuf",
    )
    assert decode(body) == FULL
    # With a 4-byte big-endian prefix equal to the remaining length (the vLLM fork's form).
    assert decode(prefixed(body)) == FULL


def test_msgpack_map() -> None:
    value = {
        "prompt_ids": [1, 2, 49151],
        "max_tokens": 64,
        "temperature": 0.5,
        "stop": ["\n\n", "stop"],
        "stream_format": "protobuf",
    }
    assert decode(packed(value), MSGPACK) == FULL
    # The spec's example: {prompt_ids, max_tokens, stream_format}; key order is free.
    example = {"stream_format": "msgpack", "max_tokens": 256, "prompt_ids": [1, 2, 3]}
    assert decode(packed(example), MSGPACK) == CodecRequestBody((1, 2, 3), 256)


def test_defaults() -> None:
    # proto3: absent is 0 / 0.0 / "": max_tokens 256, greedy, msgpack (see the module doc).
    assert decode(proto(prompt_ids=[5])) == CodecRequestBody((5,), DEFAULT_MAX_TOKENS, 0.0)
    # msgpack can leave temperature to the backend; nil means absent.
    assert decode(packed({"prompt_ids": [5], "temperature": None}), MSGPACK) == (
        CodecRequestBody((5,), DEFAULT_MAX_TOKENS, None)
    )
    assert decode(packed({"prompt_ids": [5], "max_tokens": 0}), MSGPACK).max_tokens == 256


def test_upstream_fields_are_a_token_id_prompt() -> None:
    assert FULL.completion_fields() == {
        "prompt": [1, 2, 49151],
        "max_tokens": 64,
        "temperature": 0.5,
        "stop": ["\n\n", "stop"],
    }
    assert CodecRequestBody((5,)).completion_fields() == {"prompt": [5], "max_tokens": 256}


def test_unpacked_ids_and_unknown_fields() -> None:
    unknown = bytes.fromhex("30 07 39") + bytes(8) + bytes.fromhex("45 00 00 00 00 52 01 78")
    body = bytes.fromhex("08 05 08 96 01") + unknown + proto(prompt_ids=[7])
    assert decode(body).prompt_ids == (5, 150, 7)
    assert decode(packed({"prompt_ids": [5], "model": "x", b"raw": 1}), MSGPACK).prompt_ids == (5,)


@pytest.mark.parametrize(
    "content_type",
    ["application/x-protobuf; charset=binary", "Application/X-Protobuf", " application/x-protobuf"],
)
def test_media_type_parameters_and_case(content_type: str) -> None:
    assert decode(proto(prompt_ids=[1]), content_type).prompt_ids == (1,)


@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/json", "application/msgpack", "application/octet-stream", "text/plain"],
)
def test_other_content_types_are_415(content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        decode_codec_request(proto(prompt_ids=[1]), content_type, LIMITS)
    assert info.value.status_hint == 415
    assert "application/x-msgpack" in info.value.message


# --- invalid bodies ---------------------------------------------------------------------------

BAD_FORMAT = "invalid_stream_format"
BAD_PROTOBUF = {
    "empty": ("", "invalid_prompt"),
    "no prompt_ids": (proto(max_tokens=5).hex(), "invalid_prompt"),
    "6-byte varint id": ("0a 06 ff ff ff ff ff 01", "varint_too_long"),
    "6-byte max_tokens": ("0a 01 05 10 80 80 80 80 80 01", "varint_too_long"),
    "6-byte key": ("ff ff ff ff ff 01", "varint_too_long"),
    "id over uint32": ("0a 05 ff ff ff ff 1f", "invalid_codec_request"),
    "id outside the vocabulary": ("0a 03 80 80 03", "invalid_token_id"),
    "max_tokens over uint32": ("0a 01 05 10 ff ff ff ff 1f", "invalid_codec_request"),
    "truncated varint": ("0a 02 05 ff", "truncated"),
    "ids past the end": ("0a 05 01", "truncated"),
    "temperature truncated": ("0a 01 05 1d 00 00", "truncated"),
    "temperature NaN": ("0a 01 05 1d 00 00 c0 7f", "invalid_value"),
    "temperature negative": ("0a 01 05 1d 00 00 80 bf", "invalid_value"),
    "temperature as varint": ("0a 01 05 18 01", "invalid_type"),
    "max_tokens as bytes": ("0a 01 05 12 00", "invalid_type"),
    "stop as varint": ("0a 01 05 20 01", "invalid_type"),
    "stop not utf-8": ("0a 01 05 22 01 ff", "invalid_codec_request"),
    "stream_format unknown": (proto(prompt_ids=[1], stream_format="cbor").hex(), BAD_FORMAT),
    "stream_format json": (proto(prompt_ids=[1], stream_format="json").hex(), BAD_FORMAT),
    "field number 0": ("0a 01 05 02 00", "invalid_codec_request"),
    "group wire type": ("0a 01 05 33", "invalid_codec_request"),
    "prefix too short": ("00 00 00", "truncated"),
    "prefix longer than the body": ("00 00 00 05 0a 01 05", "bad_length_prefix"),
    "prefix shorter than the body": ("00 00 00 02 0a 01 05", "bad_length_prefix"),
}  # fmt: skip


@pytest.mark.parametrize(("hex_body", "code"), BAD_PROTOBUF.values(), ids=BAD_PROTOBUF.keys())
def test_invalid_protobuf(hex_body: str, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        decode(bytes.fromhex(hex_body))
    assert info.value.status_hint == 400
    assert info.value.code == code
    assert info.value.message.startswith("CodecRequest: ")


BAD_MSGPACK = {
    "empty": (b"", "invalid_codec_request"),
    "not a map": (packed([1, 2]), "invalid_codec_request"),
    "trailing bytes": (packed({"prompt_ids": [1]}) + b"\x00", "invalid_codec_request"),
    "truncated": (packed({"prompt_ids": [1, 2]})[:-1], "invalid_codec_request"),
    "0xc1": (b"\x81\xaaprompt_ids\xc1", "invalid_codec_request"),
    "integer keys": (packed({0: [1]}), "invalid_codec_request"),
    "prompt_ids missing": (packed({"max_tokens": 5}), "invalid_prompt"),
    "prompt_ids empty": (packed({"prompt_ids": []}), "invalid_prompt"),
    "prompt_ids a string": (packed({"prompt_ids": "hello"}), "invalid_type"),
    "prompt_ids bools": (packed({"prompt_ids": [True]}), "invalid_type"),
    "prompt_ids floats": (packed({"prompt_ids": [1.0]}), "invalid_type"),
    "prompt id negative": (packed({"prompt_ids": [-1]}), "invalid_token_id"),
    "prompt id past the vocabulary": (packed({"prompt_ids": [VOCAB]}), "invalid_token_id"),
    "max_tokens a string": (packed({"prompt_ids": [1], "max_tokens": "9"}), "invalid_type"),
    "max_tokens negative": (packed({"prompt_ids": [1], "max_tokens": -1}), "invalid_value"),
    "max_tokens a bool": (packed({"prompt_ids": [1], "max_tokens": True}), "invalid_type"),
    "temperature a string": (packed({"prompt_ids": [1], "temperature": "0"}), "invalid_type"),
    "temperature infinite": (packed({"prompt_ids": [1], "temperature": math.inf}), "invalid_value"),
    "stop a string": (packed({"prompt_ids": [1], "stop": "x"}), "invalid_type"),
    "stop bytes": (packed({"prompt_ids": [1], "stop": [b"x"]}), "invalid_type"),
    "stream_format an int": (packed({"prompt_ids": [1], "stream_format": 1}), "invalid_type"),
    "stream_format unknown": (packed({"prompt_ids": [1], "stream_format": "x"}), BAD_FORMAT),
}  # fmt: skip


@pytest.mark.parametrize(("body", "code"), BAD_MSGPACK.values(), ids=BAD_MSGPACK.keys())
def test_invalid_msgpack(body: bytes, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        decode(body, MSGPACK)
    assert info.value.status_hint == 400
    assert info.value.code == code


def test_errors_chain_the_foreign_exception() -> None:
    with pytest.raises(BadRequest) as info:
        decode(b"\xc1", MSGPACK)
    assert isinstance(info.value.__cause__, ValueError)


# --- every truncation point -------------------------------------------------------------------


def test_every_truncation_point() -> None:
    fields: list[dict[str, Any]] = [
        {"prompt_ids": [1, 300, 49151]},
        {"max_tokens": 70000},
        {"temperature": 0.25},
        {"stop": ["ab"]},
        {"stop": ["ab", "é"]},
        {"stream_format": "msgpack-delta"},
    ]
    # protoc writes fields in number order, so each growing message is a prefix of the next:
    # those lengths are where an unprefixed body can end on a field boundary.
    grown: dict[str, Any] = {}
    boundaries = set()
    for field in fields:
        grown |= field
        boundaries.add(len(proto(**grown)))
    body = proto(**grown)
    assert all(proto(**grown)[:end] == body[:end] for end in boundaries)
    for cut in range(len(body)):
        # A prefixed body knows its length: every cut is an error.
        with pytest.raises(BadRequest):
            decode(prefixed(body)[: cut + 4])
        # An unprefixed protobuf has no end marker: a cut between fields is a shorter message,
        # any other cut is an error (the empty body has no prompt).
        if cut in boundaries:
            assert decode(body[:cut]).prompt_ids == (1, 300, 49151)
        else:
            with pytest.raises(BadRequest):
                decode(body[:cut])
    as_map = packed({"prompt_ids": [1, 300, 49151], "max_tokens": 70000, "stop": ["ab"]})
    for cut in range(len(as_map)):
        with pytest.raises(BadRequest):
            decode(as_map[:cut], MSGPACK)


# --- properties and fuzzing -------------------------------------------------------------------

requests = st.builds(
    CodecRequestBody,
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20).map(tuple),
    st.integers(1, 0xFFFFFFFF),
    st.floats(0, 2, width=32),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.sampled_from(["msgpack", "msgpack-delta", "protobuf", "protobuf-delta"]),
)


@given(requests, st.booleans())
def test_protobuf_round_trip(request: CodecRequestBody, with_prefix: bool) -> None:
    body = proto(
        prompt_ids=request.prompt_ids,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        stop=request.stop,
        stream_format=request.stream_format,
    )
    assert decode(prefixed(body) if with_prefix else body) == request


@given(requests)
def test_msgpack_round_trip(request: CodecRequestBody) -> None:
    value = {
        "prompt_ids": list(request.prompt_ids),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stop": list(request.stop),
        "stream_format": request.stream_format,
    }
    assert decode(packed(value), MSGPACK) == request


@given(st.binary(max_size=300), st.sampled_from([MSGPACK, PROTOBUF]))
def test_random_bytes_only_raise_bad_request(body: bytes, content_type: str) -> None:
    with contextlib.suppress(BadRequest):
        result = decode(body, content_type)
        assert all(0 <= i < VOCAB for i in result.prompt_ids)


@given(requests, st.data())
@pytest.mark.parametrize("content_type", [MSGPACK, PROTOBUF])
def test_mutated_bodies_only_raise_bad_request(
    content_type: str, request: CodecRequestBody, data: st.DataObject
) -> None:
    if content_type == MSGPACK:
        body = bytearray(
            packed({"prompt_ids": list(request.prompt_ids), "stop": list(request.stop)})
        )
    else:
        body = bytearray(proto(prompt_ids=request.prompt_ids, stop=request.stop))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(body)))
        if position == len(body) or data.draw(st.booleans()):
            body[position:position] = data.draw(st.binary(min_size=1, max_size=6))
        else:
            body[position] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(BadRequest):
        result = decode(bytes(body), content_type)
        assert result.prompt_ids
        assert result.max_tokens > 0


# --- long prompts: counted before they are decoded --------------------------------------------

SMALL = PromptLimits(VOCAB, 4)


def packed_field(region: bytes) -> bytes:
    return b"\x0a" + protowire.varint(len(region)) + region


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (proto(prompt_ids=[1, 2, 3, 4, 5]), PROTOBUF),
        # Counted from the bytes: the values (outside the vocabulary) are never decoded.
        (packed_field(b"\xff\xff\x03" * 5), PROTOBUF),
        (proto(prompt_ids=[1, 2, 3]) + proto(prompt_ids=[4, 5]), PROTOBUF),  # two packed fields
        (bytes.fromhex("08 01 08 02 08 03 08 04 08 05"), PROTOBUF),  # unpacked
        (packed({"prompt_ids": [1, 2, 3, 4, 5]}), MSGPACK),
        # msgpack's array limit stops at the header, before the elements are built.
        (packed({"prompt_ids": [1], "extra": [True] * 5}), MSGPACK),
        (b"\x81\xaaprompt_ids\xdd\xff\xff\xff\xff", MSGPACK),  # 4 Gi items claimed, none sent
    ],
    ids=["packed", "packed-unchecked", "two-packed", "unpacked", "msgpack", "any-array", "claim"],
)
def test_more_ids_than_the_limit_are_a_413(body: bytes, content_type: str) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        decode_codec_request(body, content_type, SMALL)
    assert (info.value.status_hint, info.value.code) == (413, "prompt_too_long")


def test_as_many_ids_as_the_limit_are_fine() -> None:
    ids = (1, 2, 3, 4)
    assert decode_codec_request(proto(prompt_ids=ids), PROTOBUF, SMALL).prompt_ids == ids
    assert decode_codec_request(packed({"prompt_ids": ids}), MSGPACK, SMALL).prompt_ids == ids


@pytest.mark.parametrize(
    "body",
    [
        # A surrogate's UTF-8 form (RFC 3629 §3) is not UTF-8: msgpack strings are refused.
        b"\x82\xaaprompt_ids\x91\x01\xa4stop\x91\xa3\xed\xa0\x80",
        b"\x82\xaaprompt_ids\x91\x01\xa5other\xa3\xed\xa0\x80",
        # Nesting deeper than the unpacker's stack, in a known and in an unknown key.
        b"\x81\xa4stop" + b"\x91" * 5000 + b"\x01",
        b"\x82\xaaprompt_ids\x91\x01\xa5other" + b"\x81\xa1a" * 5000 + b"\x01",
    ],
    ids=["surrogate-stop", "surrogate-unknown", "deep-stop", "deep-unknown"],
)
def test_bad_strings_and_deep_nesting_in_msgpack_are_a_400(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        decode(body, MSGPACK)
    assert (info.value.status_hint, info.value.code) == (400, "invalid_codec_request")


def reference_packed(region: bytes) -> list[int] | None:
    """The values one varint at a time, as the reader always could; None for an error."""
    reader = protowire.WireReader(region, lambda m, c: BadRequest(m, code=c), "bad")
    values = []
    try:
        while not reader.at_end:
            values.append(reader.uint32())
    except BadRequest:
        return None
    return values


varint_bytes = st.one_of(
    st.integers(0, 2**35).map(protowire.varint),
    st.binary(min_size=1, max_size=7),  # anything, valid or not
    st.integers(0, 127).map(lambda b: bytes([0x80, 0x80, b])),  # padded: valid, non-canonical
)


@given(st.lists(varint_bytes, min_size=1, max_size=40), st.integers(1, 9), st.integers(1, 9))
def test_packed_ids_decode_as_one_varint_at_a_time(
    pieces: list[bytes], scan: int, slice_bytes: int
) -> None:
    region = b"".join(pieces)
    expected = reference_packed(region)
    with pytest.MonkeyPatch.context() as patch:
        # Windows and slices of a few bytes: every boundary falls inside some varint.
        patch.setattr(protowire, "SCAN_BYTES", scan)
        patch.setattr(protowire, "PACKED_SLICE_BYTES", slice_bytes)
        body = packed_field(region)
        limits = PromptLimits(2**32, 1000)
        if expected is None:
            with pytest.raises(BadRequest) as info:
                decode_codec_request(body, PROTOBUF, limits)
            assert info.value.status_hint == 400
        else:
            assert list(decode_codec_request(body, PROTOBUF, limits).prompt_ids) == expected
