"""Path B: the body of `POST /v1/completions/codec`, one `CodecRequest` (codec-spec.md §3.3).

    application/x-msgpack   a map {prompt_ids, max_tokens, temperature, stop, stream_format}
    application/x-protobuf  the `CodecRequest` message (proxy/codec.proto), without a length
                            prefix, or with a 4-byte big-endian one equal to the remaining
                            length (the vLLM fork strips such a prefix; interop.md §2.1)

The decoder takes bytes already read and decompressed: the body size limit is the edge's job.
Everything is checked before the upstream is contacted, and every failure is a `BadRequest`
(400) saying what was wrong: malformed msgpack or protobuf, a varint longer than 5 bytes (I-D
§ Security), truncation, a field of the wrong type, an ID outside the vocabulary (§12 item 12).
Another content type is a 415 (§12 item 15); more IDs than `max_prompt_ids` a 413, found before
they are decoded (msgpack's own array limit; protobuf's packed bytes counted).

Where the spec is silent:
- `max_tokens` absent or 0 means 256, the vLLM fork's default (proto3 cannot tell 0 from absent,
  §11 item 25, so msgpack's 0 means the same).
- `temperature`: a msgpack map without it leaves the backend's default. proto3 has no
  "absent" for a float: an unset field *is* 0.0, so a protobuf request without it is greedy.
- `stream_format` absent or "" means msgpack; the response format follows it, never the
  request's Content-Type. "json" is refused: Path B answers with Codec frames only.
- Unknown msgpack keys and unknown protobuf fields are ignored (proto3 semantics).
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from proxy.core.errors import BadRequest, UnsupportedMediaType
from proxy.core.shown import quoted
from proxy.core.wire import protowire
from proxy.core.wire.formats import (
    MSGPACK,
    MSGPACK_MEDIA_TYPE,
    PROTOBUF_MEDIA_TYPE,
    check_stream_format,
)
from proxy.core.wire.prompt_ids import PromptLimits, item_types, outside_vocabulary

DEFAULT_MAX_TOKENS: Final = 256
DEFAULT_STREAM_FORMAT: Final = MSGPACK

_FLOAT32 = struct.Struct("<f")
_PREFIX = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class CodecRequestBody:
    """A decoded, validated Path B request."""

    prompt_ids: tuple[int, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    stream_format: str = DEFAULT_STREAM_FORMAT

    def completion_fields(self) -> dict[str, Any]:
        """The OpenAI `/v1/completions` fields it asks for: a token-ID prompt, never text."""
        fields: dict[str, Any] = {"prompt": list(self.prompt_ids), "max_tokens": self.max_tokens}
        if self.temperature is not None:
            fields["temperature"] = self.temperature
        if self.stop:
            fields["stop"] = list(self.stop)
        return fields


def media_type(content_type: str | None) -> str:
    """`type/subtype`, lowercase, parameters dropped (RFC 9110 §8.3.1)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_codec_request(
    body: bytes, content_type: str | None, limits: PromptLimits
) -> CodecRequestBody:
    kind = media_type(content_type)
    if kind == MSGPACK_MEDIA_TYPE:
        fields = _msgpack_fields(body, limits)
    elif kind == PROTOBUF_MEDIA_TYPE:
        fields = _protobuf_fields(body, limits)
    else:
        raise UnsupportedMediaType(
            f"Content-Type {quoted(content_type or '(none)')} is not a CodecRequest; "
            f"send {MSGPACK_MEDIA_TYPE} or {PROTOBUF_MEDIA_TYPE}",
            code="unsupported_media_type",
        )
    return _validated(fields, limits)


def _error(message: str, code: str = "invalid_codec_request") -> BadRequest:
    return BadRequest(f"CodecRequest: {message}", code=code)


# --- msgpack --------------------------------------------------------------------------------


def _msgpack_fields(body: bytes, limits: PromptLimits) -> dict[str, Any]:
    try:
        # strict_map_key: str/bytes keys only. No array may be longer than a prompt may be: the
        # unpacker refuses one from its header, before building millions of ints. Other length
        # limits are the body size (the default).
        value = msgpack.unpackb(body, raw=False, strict_map_key=True, max_array_len=limits.max_ids)
    except ValueError as exc:  # ExtraData, FormatError, StackError, truncation, bad UTF-8
        if "max_array_len" in str(exc):  # "N exceeds max_array_len(M)"
            raise limits.too_long("CodecRequest: an array has more items") from exc
        raise _error(f"invalid msgpack: {str(exc) or type(exc).__name__}") from exc
    if type(value) is not dict:
        raise _error(f"the msgpack body is a {type(value).__name__}, not a map")
    fields: dict[str, Any] = {}
    for key in ("prompt_ids", "max_tokens", "temperature", "stop", "stream_format"):
        item = value.get(key)
        if item is not None:  # nil is absent, as in the reference struct's optional fields
            fields[key] = item
    if "prompt_ids" in fields:
        fields["prompt_ids"] = _typed_list(fields["prompt_ids"], int, "prompt_ids", "integers")
    if "stop" in fields:
        fields["stop"] = _typed_list(fields["stop"], str, "stop", "strings")
    for key, kinds in (("max_tokens", (int,)), ("temperature", (int, float))):
        if key in fields and type(fields[key]) not in kinds:
            raise _error(f"`{key}` must be a number", "invalid_type")
    if "stream_format" in fields and type(fields["stream_format"]) is not str:
        raise _error("`stream_format` must be a string", "invalid_type")
    return fields


def _typed_list(value: Any, kind: type, name: str, what: str) -> list[Any]:
    if type(value) is not list or not item_types(value) <= {kind}:
        raise _error(f"`{name}` must be an array of {what}", "invalid_type")
    return value


# --- protobuf -------------------------------------------------------------------------------


def _protobuf_fields(body: bytes, limits: PromptLimits) -> dict[str, Any]:
    # A message never starts with a byte below 0x08 (field number 0), and a length prefix of a
    # body under 16 MiB always does: so a prefix is unambiguous.
    if body and body[0] < 0x08:
        if len(body) < _PREFIX.size:
            raise _error("truncated length prefix", "truncated")
        (length,) = _PREFIX.unpack_from(body)
        if length != len(body) - _PREFIX.size:
            raise _error(
                f"length prefix says {length} bytes, {len(body) - _PREFIX.size} follow",
                "bad_length_prefix",
            )
        body = body[_PREFIX.size :]
    reader = protowire.WireReader(body, _error, "invalid_codec_request")
    ids: list[int] = []
    stop: list[str] = []
    fields: dict[str, Any] = {"temperature": 0.0}
    while not reader.at_end:
        number, wire_type = reader.key()
        if number == 1 and wire_type == protowire.LEN:  # packed, as the schema declares
            packed, count = reader.packed_uint32(reader.length_delimited_end())
            limits.check_count(len(ids) + count, "CodecRequest: prompt_ids")
            _decode_packed(packed, count, ids)
        elif number == 1 and wire_type == protowire.VARINT:  # unpacked: valid proto3 too
            ids.append(reader.uint32())
            limits.check_count(len(ids), "CodecRequest: prompt_ids")
        elif number == 2 and wire_type == protowire.VARINT:
            fields["max_tokens"] = reader.uint32()
        elif number == 3 and wire_type == protowire.I32:
            (fields["temperature"],) = _FLOAT32.unpack(reader.take(reader.field_end(4)))
        elif number == 4 and wire_type == protowire.LEN:
            stop.append(reader.text("stop"))
        elif number == 5 and wire_type == protowire.LEN:
            fields["stream_format"] = reader.text("stream_format")
        elif number <= 5:
            raise _error(f"protobuf field {number} has wire type {wire_type}", "invalid_type")
        else:
            reader.skip(wire_type)
    if ids:
        fields["prompt_ids"] = ids
    if stop:
        fields["stop"] = stop
    return fields


def _decode_packed(packed: bytes, count: int, ids: list[int]) -> None:
    """Append the `count` values of packed varints that `WireReader.packed_uint32` checked,
    into a list sized once (growing a list of millions copies it, in one call, each time it is
    reallocated)."""
    filled = len(ids)
    ids.extend(itertools.repeat(0, count))
    for values in protowire.packed_slices(packed):
        ids[filled : filled + len(values)] = values
        filled += len(values)


# --- both -----------------------------------------------------------------------------------


def _validated(fields: dict[str, Any], limits: PromptLimits) -> CodecRequestBody:
    ids: list[int] = fields.get("prompt_ids", [])
    if not ids:
        raise _error("`prompt_ids` is required and must not be empty", "invalid_prompt")
    limits.check_count(len(ids), "CodecRequest: prompt_ids")
    token_id = outside_vocabulary(ids, limits.vocab_size)
    if token_id is not None:
        raise _error(
            f"prompt token ID {token_id} is outside the vocabulary [0, {limits.vocab_size})",
            "invalid_token_id",
        )
    max_tokens: int = fields.get("max_tokens", 0)
    if not 0 <= max_tokens <= protowire.MAX_UINT32:
        raise _error("`max_tokens` must be a uint32", "invalid_value")
    temperature: float | None = fields.get("temperature")
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise _error("`temperature` must be a finite number >= 0", "invalid_value")
    try:
        stream_format = check_stream_format(
            fields.get("stream_format") or DEFAULT_STREAM_FORMAT, json_allowed=False
        )
    except BadRequest as exc:  # said as every other CodecRequest error is
        raise _error(exc.message, "invalid_stream_format") from exc
    return CodecRequestBody(
        tuple(ids),
        max_tokens or DEFAULT_MAX_TOKENS,
        None if temperature is None else float(temperature),
        tuple(fields.get("stop", ())),
        stream_format,
    )
