"""Hypothesis strategies for malformed and odd request bodies: Path A JSON and Path B msgpack and
protobuf. Shared by the parser fuzz tests (tests/core) and the in-process proxy's
(tests/server)."""

from __future__ import annotations

import json
import struct
from typing import Any

import msgpack
from hypothesis import strategies as st

from proxy.core.wire import protowire

VOCAB = 49152  # SmolLM2, the tests' tokenizer

# Strings a JSON body can carry but the backend must never get: lone surrogates among them.
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x00", "", "msgpack", "json", "\u2028"]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, VOCAB + 3),
    st.floats(),
    texts,
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
# msgpack integers are 64-bit; it also carries bytes.
msgpack_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-3, VOCAB + 3),
    st.floats(),
    texts,
    st.binary(max_size=4),
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
token_ids = st.lists(st.integers(-2, VOCAB + 2) | scalars, min_size=0, max_size=12)
prompts = st.one_of(
    texts,
    token_ids,
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    st.lists(token_ids | texts, max_size=3),  # batches
    values,
)
stream_formats = (
    st.sampled_from(
        ["msgpack", "msgpack-delta", "protobuf", "protobuf-delta", "json", "", "cbor", "MSGPACK"]
    )
    | values
)

KNOWN = ("n", "best_of", "echo", "max_tokens", "max_completion_tokens", "temperature", "stream")


@st.composite
def json_objects(draw: st.DrawFn) -> dict[str, Any]:
    """A completion or chat body: known fields with random (often wrong) types."""
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["stream_format"] = draw(stream_formats)
    if draw(st.booleans()):
        body["prompt"] = draw(prompts)
    if draw(st.booleans()):
        message = st.fixed_dictionaries({"role": texts, "content": texts | values})
        body["messages"] = draw(st.lists(message, max_size=2) | values)
    for field in draw(st.lists(st.sampled_from(KNOWN), max_size=3, unique=True)):
        body[field] = draw(st.integers(0, 3) | values)
    if draw(st.booleans()):
        body["stop"] = draw(st.lists(texts, max_size=3) | values)
    body.update(draw(st.dictionaries(texts, values, max_size=2)))
    return body


def nested(depth: int) -> str:
    return '{"prompt": "x", "stream_format": "msgpack", "a": ' + "[" * depth + "]" * depth + "}"


@st.composite
def codec_objects(draw: st.DrawFn) -> dict[str, Any]:
    """A Codec request that mostly passes validation, with odd extra fields: what goes on to
    the upstream body."""
    body: dict[str, Any] = {
        "stream_format": draw(st.sampled_from(["msgpack", "protobuf", "msgpack-delta"])),
        "prompt": draw(texts | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)),
        "messages": [{"role": "user", "content": draw(texts)}],
    }
    body.update(draw(st.dictionaries(texts, values, max_size=3)))
    return body


def _encoded(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as `\ud800` escapes, as a client would send them.
    return json.dumps(value).encode()


@st.composite
def _mangled(draw: st.DrawFn) -> bytes:
    raw = bytearray(_encoded(draw(json_objects())))
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, len(raw)))
        raw[position:position] = draw(st.binary(min_size=1, max_size=3))
    return bytes(raw)


# Bytes for a JSON route: objects with fields of any type, Codec requests with odd fields,
# mangled objects, nesting around orjson's limits (254 written, 1024 read), anything at all.
json_bodies = st.one_of(
    json_objects().map(_encoded),
    codec_objects().map(_encoded),
    _mangled(),
    st.sampled_from([253, 300, 1023, 1024, 1025, 20_000]).map(lambda d: nested(d).encode()),
    st.binary(max_size=40) | values.map(_encoded),
)


@st.composite
def msgpack_bodies(draw: st.DrawFn) -> bytes:
    """A Path B msgpack body: a map of known keys with random values, or random bytes."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=40))
    fields: dict[Any, Any] = {}
    if draw(st.booleans()):
        ids = st.lists(st.integers(-2, VOCAB + 2) | msgpack_scalars, max_size=12)
        fields["prompt_ids"] = draw(ids | msgpack_values)
    for key in ("max_tokens", "temperature", "stop", "stream_format"):
        if draw(st.booleans()):
            odd = (
                st.sampled_from(["msgpack", "json", ""]) if key == "stream_format" else st.nothing()
            )
            fields[key] = draw(msgpack_values | st.lists(texts, max_size=3) | odd)
    keys = texts | st.binary(max_size=3)
    fields.update(draw(st.dictionaries(keys, msgpack_values, max_size=2)))
    # Lone surrogates in strings go out as their (invalid) UTF-8 form.
    body = bytes(msgpack.packb(fields, unicode_errors="surrogatepass"))
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]
    return body


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return protowire.varint(number << 3 | wire_type) + payload


@st.composite
def protobuf_bodies(draw: st.DrawFn) -> bytes:
    """A Path B protobuf body: CodecRequest-like fields with random wire types and payloads."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=40))
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 7))
        wire_type = draw(st.sampled_from([0, 1, 2, 5, 3, 7]))
        if wire_type == 0:
            payload = protowire.varint(draw(st.integers(0, 2**40)))
        elif wire_type == 2:
            inner = draw(
                st.lists(st.integers(0, 2**33), max_size=8).map(
                    lambda ids: b"".join(protowire.varint(i) for i in ids)
                )
                | st.binary(max_size=8)
                | texts.map(lambda t: t.encode("utf-8", "surrogatepass"))
            )
            payload = protowire.varint(len(inner) + draw(st.sampled_from([0, 0, 1]))) + inner
        else:
            payload = draw(st.binary(min_size=0, max_size=8))
        out += _field(number, wire_type, payload)
    body = bytes(out)
    if draw(st.booleans()):
        length = len(body) + draw(st.sampled_from([0, 0, -1, 1]))
        body = struct.pack(">I", max(length, 0)) + body
    return body
