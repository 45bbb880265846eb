"""What a Codec server answered, and what rendering it takes: the plan both Codec clients follow.

The OpenAI SDK transport (proxy/sdk/transport.py) and codec-proxy in front of a Codec server
(proxy/server/control/codec_upstream.py) ask a request as Codec (ask.py), then read the answer's
head here. `read_answer` says what it is:

* `Frames`: a 200 whose body is Codec frames, by its media type or codec-proxy's
  `Codec-Stream-Format`. Rendering it takes the map its IDs follow (`Codec-Tokenizer-Map`, by
  digest) and, for dictionary zstd, the dictionary (`Codec-Zstd-Dict`), each fetched and checked
  by the caller (assets.py, reading.py); `Frames.body` then assembles the rest: the renderer the
  request asked for (SSE chunks or the whole answer) with its envelope, the decompressor, the
  frame decoder with the draft's frame cap (codec-spec.md §10, 16 MiB).
* `Unrenderable`: frames that name no map, or zstd that names no dictionary: asked again as
  JSON, and no Codec for a while.
* `NotFrames`: a 200 that is not Codec (the server ignored `stream_format`): its JSON is the
  answer when it is the stream the client asked for; no Codec for a while.
* `Failed`: an error. Only some statuses may be a refusal of Codec (ask.py `REFUSAL_STATUSES`),
  which the body says (`fallback_for`), read within `MAX_ERROR_BYTES` (reading.py); any other is
  the API's own answer.

Once rendered, an answer whose IDs went past the map's vocabulary (`RenderedBody.map_drift`)
means the map is fetched again before it is used for another (assets.py `forget_map`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, cast

from proxy.core.client.ask import REFUSAL_STATUSES, CodecAsk
from proxy.core.client.assets import dictionary_digest
from proxy.core.compression.decompressors import new_decompressor
from proxy.core.http.content_coding import ZSTD
from proxy.core.maps.tokenizer_map import digest_of_header
from proxy.core.render.body import FrameFormat, RenderedBody
from proxy.core.render.openai import CompletionRenderer, Envelope, SseRenderer
from proxy.core.render.turn import TextRules
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.formats import SERVED_AS_ASKED, format_of_media_type

__all__ = [
    "Answer",
    "Failed",
    "Frames",
    "NotFrames",
    "Unrenderable",
    "backend_ids",
    "envelope_for",
    "frame_format",
    "read_answer",
    "renderer_for",
]


@dataclass(frozen=True, slots=True)
class Frames:
    """A Codec body to render, once its map (and dictionary) are held."""

    stream_format: FrameFormat
    map_digest: str
    dictionary_digest: str | None  # the dictionary a zstd body needs
    content_encoding: str | None
    token_source: str | None  # `Codec-Token-Source`

    def body(
        self,
        ask: CodecAsk,
        decoder: MapDecoder,
        dictionary: bytes | None,
        *,
        request_id: str,
        created: int,
    ) -> RenderedBody:
        """The body's bytes in, the OpenAI JSON `ask`'s client expects out."""
        envelope = envelope_for(ask, request_id, created)
        renderer = renderer_for(
            ask, decoder, envelope=envelope, codec_token_source=self.token_source
        )
        # The frame decoder keeps to the draft's frame cap (render/body.py).
        return RenderedBody(
            renderer, self.stream_format, new_decompressor(self.content_encoding, dictionary)
        )


@dataclass(frozen=True, slots=True)
class Unrenderable:
    """Frames this client cannot render: ask again as JSON. `reason` for counts and logs."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class NotFrames:
    """A 200 that is not Codec: the server ignored `stream_format`."""

    reason: ClassVar[str] = "not_codec"


@dataclass(frozen=True, slots=True)
class Failed:
    """An error answer; `may_be_refusal` when its body decides whether it refuses Codec."""

    status: int

    @property
    def may_be_refusal(self) -> bool:
        return self.status in REFUSAL_STATUSES


Answer = Frames | Unrenderable | NotFrames | Failed


def read_answer(status: int, headers: Mapping[str, str]) -> Answer:
    """What the head of an answer to a Codec request says (module docstring). `headers`
    case-insensitive, as httpx's and aiohttp's are."""
    if status != 200:
        return Failed(status)
    fmt = frame_format(headers.get("content-type"), headers.get("codec-stream-format"))
    if fmt is None:
        return NotFrames()
    digest = digest_of_header(headers.get("codec-tokenizer-map"))
    if digest is None:
        return Unrenderable(
            "no_tokenizer_map", "the answer names no tokenizer map (Codec-Tokenizer-Map)"
        )
    coding = headers.get("content-encoding")
    dictionary = None
    if (coding or "").strip().lower() == ZSTD:
        dictionary = dictionary_digest(headers.get("codec-zstd-dict"))
        if dictionary is None:
            return Unrenderable(
                "no_zstd_dictionary", "a zstd answer names no dictionary (Codec-Zstd-Dict)"
            )
    return Frames(fmt, digest, dictionary, coding, headers.get("codec-token-source"))


def frame_format(content_type: str | None, codec_stream_format: str | None) -> FrameFormat | None:
    """The frame format of a response: codec-proxy names it in `Codec-Stream-Format` (the only
    way to tell `msgpack-delta` from `msgpack`, docs/ENDPOINTS.md); else the media type says it.
    None: not a Codec body (a JSON-SSE stream, an error)."""
    if codec_stream_format is not None:
        named = codec_stream_format.strip().lower()
        return cast(FrameFormat, named) if named in SERVED_AS_ASKED else None
    media_type = (content_type or "").partition(";")[0].strip().lower()
    return cast(FrameFormat | None, format_of_media_type(media_type))


def envelope_for(ask: CodecAsk, request_id: str, created: int) -> Envelope:
    """What every chunk repeats: OpenAI's id prefixes on the request's id (the one the proxy
    forwards and echoes in `X-Request-Id`), the caller's clock, the model the client named."""
    prefix = "chatcmpl" if ask.endpoint == "chat" else "cmpl"
    return Envelope(ask.endpoint, f"{prefix}-{request_id}", created, ask.model)


def backend_ids(codec_token_source: str | None) -> bool:
    """Whether an answer's IDs are the backend's (`Codec-Token-Source: backend`): then a
    tool-call turn's frames carry its markup too (render/turn.py)."""
    return (codec_token_source or "").strip().lower() == "backend"


def renderer_for(
    ask: CodecAsk, decoder: MapDecoder, *, envelope: Envelope, codec_token_source: str | None
) -> SseRenderer | CompletionRenderer:
    """The renderer of `ask`'s answer: SSE chunks when the client streams, else the whole
    answer; the request's stop strings, the answer's token source."""
    rules = TextRules(stop=ask.rules.stop, backend_ids=backend_ids(codec_token_source))
    if ask.streamed:
        return SseRenderer(decoder, envelope, rules=rules, include_usage=ask.include_usage)
    return CompletionRenderer(decoder, envelope, rules=rules)
