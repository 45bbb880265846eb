"""The `stream_format` values a client may ask for: one registry for Path A, Path B and the
encoders (codec-spec.md §1).

`json` is the OpenAI stream, passed through; the binary formats are Codec. `protobuf-delta` is
accepted but has no defined wire layout (§1.5, §11 item 8): it is answered as `protobuf`, which
the response names in `Codec-Stream-Format`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from proxy.core.errors import BadRequest
from proxy.core.shown import quoted

JSON: Final = "json"
MSGPACK: Final = "msgpack"
MSGPACK_DELTA: Final = "msgpack-delta"
PROTOBUF: Final = "protobuf"
PROTOBUF_DELTA: Final = "protobuf-delta"

# Every binary format a client may ask for, and the one actually sent for it.
SENT_AS: Final[Mapping[str, str]] = {
    MSGPACK: MSGPACK,
    MSGPACK_DELTA: MSGPACK_DELTA,
    PROTOBUF: PROTOBUF,
    PROTOBUF_DELTA: PROTOBUF,
}
BINARY_FORMATS: Final = tuple(SENT_AS)
STREAM_FORMATS: Final = (JSON, *BINARY_FORMATS)
# The Codec formats a request gets as it asked: what `GET /codec/version` lists.
SERVED_AS_ASKED: Final = tuple(f for f, sent in SENT_AS.items() if f == sent)
# The delta-varint axis (v0.5 § v0.5-1, the I-D's "delta_varint").
DELTA_FORMATS: Final = frozenset({MSGPACK_DELTA, PROTOBUF_DELTA})

# The media types of Codec bodies (codec-spec.md §1.3): a response's `Content-Type`, what a
# client's `Accept` asks for, a Path B request's `Content-Type`.
MSGPACK_MEDIA_TYPE: Final = "application/x-msgpack"
PROTOBUF_MEDIA_TYPE: Final = "application/x-protobuf"
# The Codec website's length-prefixed msgpack (codec-spec.md §11 items 1-2), in no spec: sent
# only to a client that names it.
PREFIXED_MSGPACK_MEDIA_TYPE: Final = "application/codec+msgpack"
# Each format a response is sent in, and its media type. `msgpack-delta` shares msgpack's: the
# media type alone names msgpack or protobuf, and codec-proxy's `Codec-Stream-Format` the rest.
MEDIA_TYPES: Final[Mapping[str, str]] = {
    MSGPACK: MSGPACK_MEDIA_TYPE,
    MSGPACK_DELTA: MSGPACK_MEDIA_TYPE,
    PROTOBUF: PROTOBUF_MEDIA_TYPE,
}


def format_of_media_type(media_type: str) -> str | None:
    """The format a Codec body of `media_type` (lowercase, no parameters) is read as."""
    return next((fmt for fmt, media in MEDIA_TYPES.items() if media == media_type), None)


def check_stream_format(value: object, *, json_allowed: bool = True) -> str:
    """`value` if it names a supported format, else 400 `invalid_stream_format` listing them.

    Path A (`/v1/completions`, chat) allows `json`; Path B's `CodecRequest` is Codec only.
    """
    supported = STREAM_FORMATS if json_allowed else BINARY_FORMATS
    if isinstance(value, str) and value in supported:
        return value
    shown = quoted(value) if isinstance(value, str) else f"of type {type(value).__name__}"
    raise BadRequest(
        f"unsupported stream_format {shown}; supported values: {', '.join(supported)}",
        code="invalid_stream_format",
    )
