"""httpx transports that put Codec on the wire under an unchanged OpenAI SDK.

    OpenAI(base_url="http://proxy:8080/v1", http_client=httpx.Client(transport=CodecTransport()))

For each request the SDK makes, the transport decides (proxy/core/render/ask.py) whether to ask
for Codec. If so, it sends the same request with `stream_format`, `Codec-Client-Version` and an
`Accept-Encoding` it can decode (dictionary zstd included), loads the map and dictionary the
response names (proxy/core/render/assets.py), and hands the SDK a `text/event-stream` response
whose body is rendered from the frames as they arrive (proxy/core/render/). Everything else
goes through untouched, and so does the JSON repeat of a request Codec was refused for. The SDK
never knows.

The rendered response keeps the Codec response's other headers (`Codec-*`, `X-Request-Id`), so
`with_raw_response` shows what was on the wire; its `Content-Type` is `text/event-stream`, its
body not content-coded. `stats` counts what crossed the wire.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

try:
    import anyio
    import httpx
except ImportError as exc:  # httpx is an extra: the proxy itself does not need it
    raise ImportError("proxy.sdk needs httpx: pip install 'codec-proxy[sdk]'") from exc

from proxy.core.compression.decompressors import new_decompressor
from proxy.core.compression.dictionaries import dictionary_url
from proxy.core.http.content_coding import codec_accept_encoding
from proxy.core.maps.discovery import map_path_by_digest
from proxy.core.maps.tokenizer_map import digest_of_header
from proxy.core.render.ask import (
    CLIENT_VERSION,
    DEFAULT_REMEMBER_SECONDS,
    CodecAsk,
    Fallback,
    RefusalMemory,
    codec_ask,
    fallback_for,
)
from proxy.core.render.assets import CodecAssets, dictionary_digest
from proxy.core.render.body import FrameFormat, RenderedBody, response_stream_format
from proxy.core.render.response import envelope_for, renderer_for
from proxy.core.verify.map_decoder import MapDecoder

__all__ = ["AsyncCodecTransport", "CodecStats", "CodecTransport"]

# The formats asked for; `msgpack-delta` is larger than msgpack (docs/ENDPOINTS.md).
AskedFormat = Literal["msgpack", "protobuf"]
_MEDIA_TYPES: Final = {"msgpack": "application/x-msgpack", "protobuf": "application/x-protobuf"}
# Every coding the renderer's body decodes; the proxy picks the one smallest for its flush
# schedule among them (proxy/core/http/content_coding.py), zstd only with a dictionary.
DEFAULT_ACCEPT_ENCODING: Final = codec_accept_encoding(zstd=True)
# Headers of the SDK's request that the Codec request sets itself.
_REPLACED: Final = frozenset(
    {"accept", "accept-encoding", "codec-client-version", "content-length", "transfer-encoding"}
)
# Headers of a Codec response that do not describe the rendered body.
_NOT_RENDERED: Final = frozenset(
    {"content-type", "content-encoding", "content-length", "transfer-encoding"}
)
_DISCOVERY_CODINGS: Final = "br, gzip"


@dataclass
class CodecStats:
    """What this transport's answers cost on the wire, body bytes as received (content-coded).

    `codec_wire_bytes` against `rendered_bytes` is what Codec saved over the JSON-SSE the SDK
    read (the JSON an upstream would have sent is a little larger still: the backend's ids,
    timestamps, `system_fingerprint`). `json_wire_bytes` counts answers that passed through.
    """

    codec_responses: int = 0
    json_responses: int = 0
    codec_tokens: int = 0  # token IDs the Codec answers carried
    codec_wire_bytes: int = 0
    rendered_bytes: int = 0
    json_wire_bytes: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _codec(self, tokens: int, wire: int, rendered: int) -> None:
        with self._lock:
            self.codec_responses += 1
            self.codec_tokens += tokens
            self.codec_wire_bytes += wire
            self.rendered_bytes += rendered

    def _json(self, wire: int) -> None:
        with self._lock:
            self.json_responses += 1
            self.json_wire_bytes += wire

    def _fallback(self, reason: str) -> None:
        with self._lock:
            self.fallbacks[reason] += 1


class _Unavailable(Exception):
    """The response names no map or dictionary this client can load: ask again as JSON."""


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


class _CodecTransportBase:
    """The decisions the sync and async transports share; each does its own I/O."""

    def __init__(
        self,
        *,
        stream_format: AskedFormat = "protobuf",
        accept_encoding: str = DEFAULT_ACCEPT_ENCODING,
        remember_seconds: float = DEFAULT_REMEMBER_SECONDS,
        assets: CodecAssets | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if stream_format not in _MEDIA_TYPES:
            raise ValueError(f"stream_format must be one of {', '.join(_MEDIA_TYPES)}")
        self._stream_format = stream_format
        self._accept_encoding = accept_encoding
        self._remember_seconds = remember_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self.assets = assets if assets is not None else CodecAssets()
        self.stats = CodecStats()
        self._refusals = RefusalMemory()

    def _ask(self, request: httpx.Request, body: bytes) -> CodecAsk | None:
        ask = codec_ask(request.method, request.url.path, body, stream_format=self._stream_format)
        if isinstance(ask, str):
            return None
        if self._refusals.refused((_origin(request.url), ask.model), self._clock()):
            return None
        return ask

    def _fall_back(self, request: httpx.Request, ask: CodecAsk, fallback: Fallback) -> None:
        self._refusals.remember((_origin(request.url), ask.model), self._clock(), fallback.seconds)
        self.stats._fallback(fallback.reason)

    def _fallback_for(self, response: httpx.Response, body: bytes) -> Fallback | None:
        return fallback_for(
            response.status_code, response.headers, body, remember_seconds=self._remember_seconds
        )

    def _codec_request(self, request: httpx.Request, ask: CodecAsk) -> httpx.Request:
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _REPLACED]
        headers += [
            ("Accept", _MEDIA_TYPES[self._stream_format]),
            ("Accept-Encoding", self._accept_encoding),
            ("Codec-Client-Version", CLIENT_VERSION),
        ]
        return httpx.Request(
            "POST", request.url, headers=headers, content=ask.body, extensions=request.extensions
        )

    def _discovery_request(self, request: httpx.Request, path: str) -> httpx.Request:
        # The discovery documents are open (no key needed, CORS-simple): no credentials go.
        timeout = request.extensions.get("timeout")
        return httpx.Request(
            "GET",
            _origin(request.url) + path,
            headers={"Accept-Encoding": _DISCOVERY_CODINGS},
            extensions={"timeout": timeout} if timeout is not None else {},
        )

    def _map_path(self, response: httpx.Response) -> tuple[str, str]:
        digest = digest_of_header(response.headers.get("codec-tokenizer-map"))
        if digest is None:
            raise _Unavailable("no_tokenizer_map")
        return digest, map_path_by_digest(digest)

    def _dictionary_path(self, response: httpx.Response) -> tuple[str, str] | None:
        if response.headers.get("content-encoding", "").strip().lower() != "zstd":
            return None
        digest = dictionary_digest(response.headers.get("codec-zstd-dict"))
        if digest is None:
            raise _Unavailable("no_zstd_dictionary")
        return digest, dictionary_url(digest)

    def _rendered_body(
        self,
        ask: CodecAsk,
        response: httpx.Response,
        stream_format: FrameFormat,
        decoder: MapDecoder,
        dictionary: bytes | None,
    ) -> RenderedBody:
        # The proxy echoes the request's id (or names its own) in X-Request-Id.
        request_id = response.headers.get("x-request-id") or uuid.uuid4().hex
        renderer = renderer_for(
            ask,
            decoder,
            envelope=envelope_for(ask, request_id, int(self._wall_clock())),
            codec_token_source=response.headers.get("codec-token-source"),
        )
        decompressor = new_decompressor(response.headers.get("content-encoding"), dictionary)
        return RenderedBody(renderer, stream_format, decompressor)

    @staticmethod
    def _headers(response: httpx.Response) -> list[tuple[str, str]]:
        kept = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _NOT_RENDERED]
        return [*kept, ("content-type", "text/event-stream")]

    @staticmethod
    def _read_error(response: httpx.Response, body: bytes) -> httpx.Response:
        # `body` is decoded already: the SDK gets it without the coding it came in.
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(
            response.status_code, headers=headers, content=body, extensions=response.extensions
        )


class CodecTransport(_CodecTransportBase, httpx.BaseTransport):
    """For `httpx.Client(transport=CodecTransport())`: Codec on the wire, JSON-SSE to the SDK.

    `transport`: what actually sends (default `httpx.HTTPTransport()`). `stream_format`:
    `protobuf` (the smaller, docs/ENDPOINTS.md) or `msgpack`. `accept_encoding`: the codings
    offered. `remember_seconds`: how long a refusal without `Retry-After` keeps an origin and
    model on JSON. `assets`: maps and dictionaries, shareable between transports.
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        stream_format: AskedFormat = "protobuf",
        accept_encoding: str = DEFAULT_ACCEPT_ENCODING,
        remember_seconds: float = DEFAULT_REMEMBER_SECONDS,
        assets: CodecAssets | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            stream_format=stream_format,
            accept_encoding=accept_encoding,
            remember_seconds=remember_seconds,
            assets=assets,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        ask = self._ask(request, request.read())
        if ask is None:
            return self._passed(self._inner.handle_request(request))
        response = self._inner.handle_request(self._codec_request(request, ask))
        stream_format = response_stream_format(
            response.headers.get("content-type"), response.headers.get("codec-stream-format")
        )
        if response.status_code != 200 or stream_format is None:
            if response.status_code == 200:
                # A server that ignored `stream_format`: its JSON-SSE is the answer.
                self._fall_back(request, ask, Fallback("not_codec", self._remember_seconds))
                return self._passed(response)
            error_body = response.read()
            fallback = self._fallback_for(response, error_body)
            if fallback is None:
                return self._read_error(response, error_body)
            self._fall_back(request, ask, fallback)
            return self._passed(self._inner.handle_request(request))
        try:
            decoder = self._load_map(request, response)
            dictionary = self._load_dictionary(request, response)
        except _Unavailable as exc:
            response.close()
            self._fall_back(request, ask, Fallback(str(exc), self._remember_seconds))
            return self._passed(self._inner.handle_request(request))
        except BaseException:
            response.close()
            raise
        rendered = self._rendered_body(ask, response, stream_format, decoder, dictionary)
        return httpx.Response(
            200,
            headers=self._headers(response),
            stream=_RenderedStream(response, rendered, self.stats),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()

    def _passed(self, response: httpx.Response) -> httpx.Response:
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedStream(response, self.stats),
            extensions=response.extensions,
        )

    def _fetch(self, request: httpx.Request, path: str) -> bytes:
        response = self._inner.handle_request(self._discovery_request(request, path))
        try:
            body = response.read()
        finally:
            response.close()
        if response.status_code != 200:
            raise _Unavailable(f"discovery_{response.status_code}")
        return body

    def _load_map(self, request: httpx.Request, response: httpx.Response) -> MapDecoder:
        digest, path = self._map_path(response)
        decoder = self.assets.map(digest)
        if decoder is None:
            decoder = self.assets.add_map(digest, self._fetch(request, path))
        return decoder

    def _load_dictionary(self, request: httpx.Request, response: httpx.Response) -> bytes | None:
        named = self._dictionary_path(response)
        if named is None:
            return None
        digest, path = named
        data = self.assets.dictionary(digest)
        if data is None:
            data = self.assets.add_dictionary(digest, self._fetch(request, path))
        return data


class AsyncCodecTransport(_CodecTransportBase, httpx.AsyncBaseTransport):
    """The async twin, for `httpx.AsyncClient(transport=AsyncCodecTransport())` and
    `AsyncOpenAI`. The same arguments; `transport` defaults to `httpx.AsyncHTTPTransport()`."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        stream_format: AskedFormat = "protobuf",
        accept_encoding: str = DEFAULT_ACCEPT_ENCODING,
        remember_seconds: float = DEFAULT_REMEMBER_SECONDS,
        assets: CodecAssets | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            stream_format=stream_format,
            accept_encoding=accept_encoding,
            remember_seconds=remember_seconds,
            assets=assets,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ask = self._ask(request, await request.aread())
        if ask is None:
            return self._passed(await self._inner.handle_async_request(request))
        response = await self._inner.handle_async_request(self._codec_request(request, ask))
        stream_format = response_stream_format(
            response.headers.get("content-type"), response.headers.get("codec-stream-format")
        )
        if response.status_code != 200 or stream_format is None:
            if response.status_code == 200:
                self._fall_back(request, ask, Fallback("not_codec", self._remember_seconds))
                return self._passed(response)
            error_body = await response.aread()
            fallback = self._fallback_for(response, error_body)
            if fallback is None:
                return self._read_error(response, error_body)
            self._fall_back(request, ask, fallback)
            return self._passed(await self._inner.handle_async_request(request))
        try:
            decoder = await self._load_map(request, response)
            dictionary = await self._load_dictionary(request, response)
        except _Unavailable as exc:
            await response.aclose()
            self._fall_back(request, ask, Fallback(str(exc), self._remember_seconds))
            return self._passed(await self._inner.handle_async_request(request))
        except BaseException:
            await response.aclose()
            raise
        rendered = self._rendered_body(ask, response, stream_format, decoder, dictionary)
        return httpx.Response(
            200,
            headers=self._headers(response),
            stream=_AsyncRenderedStream(response, rendered, self.stats),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    def _passed(self, response: httpx.Response) -> httpx.Response:
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncCountedStream(response, self.stats),
            extensions=response.extensions,
        )

    async def _fetch(self, request: httpx.Request, path: str) -> bytes:
        response = await self._inner.handle_async_request(self._discovery_request(request, path))
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        if response.status_code != 200:
            raise _Unavailable(f"discovery_{response.status_code}")
        return body

    async def _load_map(self, request: httpx.Request, response: httpx.Response) -> MapDecoder:
        digest, path = self._map_path(response)
        decoder = self.assets.map(digest)
        if decoder is None:
            body = await self._fetch(request, path)
            # Reading a map takes a tenth of a second (SmolLM2) to half a second (Llama-3):
            # not on the event loop.
            decoder = await anyio.to_thread.run_sync(self.assets.add_map, digest, body)
        return decoder

    async def _load_dictionary(
        self, request: httpx.Request, response: httpx.Response
    ) -> bytes | None:
        named = self._dictionary_path(response)
        if named is None:
            return None
        digest, path = named
        data = self.assets.dictionary(digest)
        if data is None:
            data = self.assets.add_dictionary(digest, await self._fetch(request, path))
        return data


# --- the response bodies --------------------------------------------------------------------


def _sync_stream(response: httpx.Response) -> httpx.SyncByteStream:
    # The body as the inner transport hands it over: raw, content-coded, any read size.
    # (`iter_raw` would refuse a response a transport read already, as httpx's MockTransport.)
    stream = response.stream
    if not isinstance(stream, httpx.SyncByteStream):
        raise TypeError("the wrapped transport is not a sync transport")
    return stream


def _async_stream(response: httpx.Response) -> httpx.AsyncByteStream:
    stream = response.stream
    if not isinstance(stream, httpx.AsyncByteStream):
        raise TypeError("the wrapped transport is not an async transport")
    return stream


class _RenderedStream(httpx.SyncByteStream):
    """The Codec body as it arrives, rendered. A broken connection raises as it would under a
    JSON stream (the SDK's APIConnectionError / APITimeoutError), after the text before it."""

    def __init__(self, response: httpx.Response, body: RenderedBody, stats: CodecStats) -> None:
        self._response = response
        self._body = body
        self._stats = stats
        self._rendered = 0
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in _sync_stream(self._response):
            out = self._body.feed(chunk)
            if out:
                self._rendered += len(out)
                yield out
        out = self._body.flush()
        if out:
            self._rendered += len(out)
            yield out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.close()
            self._stats._codec(self._body.tokens, self._body.wire_bytes, self._rendered)


class _AsyncRenderedStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, body: RenderedBody, stats: CodecStats) -> None:
        self._response = response
        self._body = body
        self._stats = stats
        self._rendered = 0
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in _async_stream(self._response):
            out = self._body.feed(chunk)
            if out:
                self._rendered += len(out)
                yield out
        out = self._body.flush()
        if out:
            self._rendered += len(out)
            yield out

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._response.aclose()
            self._stats._codec(self._body.tokens, self._body.wire_bytes, self._rendered)


class _CountedStream(httpx.SyncByteStream):
    """A passed-through body, byte for byte, counted."""

    def __init__(self, response: httpx.Response, stats: CodecStats) -> None:
        self._response = response
        self._stats = stats
        self._bytes = 0
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in _sync_stream(self._response):
            self._bytes += len(chunk)
            yield chunk

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.close()
            self._stats._json(self._bytes)


class _AsyncCountedStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, stats: CodecStats) -> None:
        self._response = response
        self._stats = stats
        self._bytes = 0
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in _async_stream(self._response):
            self._bytes += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._response.aclose()
            self._stats._json(self._bytes)
