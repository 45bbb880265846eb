"""httpx transports that put Codec on the wire under an unchanged OpenAI SDK.

    OpenAI(base_url="http://proxy:8080/v1", http_client=httpx.Client(transport=CodecTransport()))

For each request the SDK makes, the transport decides (proxy/core/client/ask.py) whether to ask
for Codec. If so, it sends the same request with `stream_format`, `Codec-Client-Version` and an
`Accept-Encoding` it can decode (dictionary zstd included), reads what came back
(proxy/core/client/answer.py), loads the map and dictionary the response names
(proxy/core/client/assets.py), and hands the SDK a `text/event-stream` response whose body is
rendered from the frames as they arrive (proxy/core/render/). Everything else goes through
untouched, and so does the JSON repeat of a request Codec was refused for. The SDK never knows.

Every body the transport reads itself is bounded as it is decoded (proxy/core/client/reading.py):
a map, a dictionary, an error body (kept, decoded, for the SDK's error message); the frames of a
Codec body at the draft's frame cap, their IDs 4 bytes each.

The decisions are one flow (`_CodecFlow._exchange`), a generator that yields each I/O step it
needs (send a request, read a body whole, close a response, build a map's decoder); the sync
and the async transport differ only in how they run those steps.

The rendered response keeps the Codec response's other headers (`Codec-*`, `X-Request-Id`), so
`with_raw_response` shows what was on the wire; its `Content-Type` is `text/event-stream`, its
body not content-coded. `stats` counts what crossed the wire.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

try:
    import anyio
    import httpx
except ImportError as exc:  # httpx is an extra: the proxy itself does not need it
    raise ImportError("proxy.sdk needs httpx: pip install 'codec-proxy[sdk]'") from exc

import orjson

from proxy.core.client.answer import Failed, Frames, NotFrames, Unrenderable, read_answer
from proxy.core.client.ask import (
    DEFAULT_REMEMBER_SECONDS,
    CodecAsk,
    Fallback,
    RefusalMemory,
    codec_ask,
    codec_headers,
    fallback_for,
)
from proxy.core.client.assets import CodecAssets
from proxy.core.client.reading import (
    MAX_DICTIONARY_BYTES,
    MAX_ERROR_BYTES,
    MAX_MAP_BYTES,
    BodyReader,
    ReadBody,
)
from proxy.core.compression.dictionaries import dictionary_url
from proxy.core.errors import ProxyError
from proxy.core.http.content_coding import codec_accept_encoding
from proxy.core.maps.discovery import map_path_by_digest
from proxy.core.render.body import RenderedBody

__all__ = ["AsyncCodecTransport", "CodecStats", "CodecTransport"]

# The formats asked for; `msgpack-delta` is larger than msgpack (docs/ENDPOINTS.md).
AskedFormat = Literal["msgpack", "protobuf"]
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
# Headers of an error answer that do not describe its body once the transport decoded it.
_NOT_DECODED: Final = frozenset({"content-encoding", "content-length", "transfer-encoding"})
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


# --- the I/O steps the flow asks its transport for -------------------------------------------


@dataclass(frozen=True, slots=True)
class _Send:
    """Send `request`; the reply is the response, its body not read."""

    request: httpx.Request


@dataclass(frozen=True, slots=True)
class _Read:
    """Read `response`'s body whole within `limit` (reading.py), then close it; the reply is
    the `ReadBody`, or the `ProxyError` that stopped it is raised into the flow."""

    response: httpx.Response
    limit: int

    def reader(self) -> BodyReader:
        return BodyReader(self.response.headers.get("content-encoding"), self.limit)


@dataclass(frozen=True, slots=True)
class _Close:
    response: httpx.Response


@dataclass(frozen=True, slots=True)
class _LoadMap:
    """Build a fetched map's decoder and keep it (assets.py); the reply is the decoder."""

    digest: str
    body: ReadBody


_Step = _Send | _Read | _Close | _LoadMap
_Flow = Generator[_Step, Any, httpx.Response]
_Part = Generator[_Step, Any, Any]


class _Unavailable(Exception):
    """The response names no map or dictionary this client can load: ask again as JSON."""


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


class _CodecFlow:
    """What the sync and async transports decide, as one flow of steps; each runs the steps."""

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
        if stream_format not in get_args(AskedFormat):
            raise ValueError(f"stream_format must be one of {', '.join(get_args(AskedFormat))}")
        self._stream_format = stream_format
        self._accept_encoding = accept_encoding
        self._remember_seconds = remember_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self.assets = assets if assets is not None else CodecAssets()
        self.stats = CodecStats()
        self._refusals = RefusalMemory()

    def _exchange(self, request: httpx.Request, body: bytes) -> _Flow:
        ask = self._ask(request, body)
        if ask is None:
            return self._passed((yield _Send(request)))
        response = yield _Send(self._codec_request(request, ask))
        answer = read_answer(response.status_code, response.headers)
        if isinstance(answer, Failed):
            return (yield from self._failed(request, ask, response))
        if isinstance(answer, NotFrames):
            # A server that ignored `stream_format`: its JSON-SSE is the answer.
            self._fall_back(request, ask, Fallback(answer.reason, self._remember_seconds))
            return self._passed(response)
        if isinstance(answer, Unrenderable):
            yield _Close(response)
            self._fall_back(request, ask, Fallback(answer.reason, self._remember_seconds))
            return self._passed((yield _Send(request)))
        try:
            rendered = yield from self._rendered_body(request, ask, response, answer)
        except _Unavailable as exc:
            yield _Close(response)
            self._fall_back(request, ask, Fallback(str(exc), self._remember_seconds))
            return self._passed((yield _Send(request)))
        except GeneratorExit:
            raise
        except BaseException:
            yield _Close(response)
            raise
        headers = [
            *((k, v) for k, v in response.headers.multi_items() if k.lower() not in _NOT_RENDERED),
            ("content-type", "text/event-stream"),
        ]
        return httpx.Response(
            200,
            headers=headers,
            stream=self._rendered(response, _Rendering(rendered, answer.map_digest, self)),
            extensions=response.extensions,
        )

    # --- the transport's I/O: each twin's own ---------------------------------------------

    def _passed(self, response: httpx.Response) -> httpx.Response:
        raise NotImplementedError

    def _rendered(
        self, response: httpx.Response, rendering: _Rendering
    ) -> httpx.SyncByteStream | httpx.AsyncByteStream:
        raise NotImplementedError

    # --- the decisions ------------------------------------------------------------------------

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

    def _codec_request(self, request: httpx.Request, ask: CodecAsk) -> httpx.Request:
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _REPLACED]
        headers += codec_headers(self._stream_format, self._accept_encoding)
        return httpx.Request(
            "POST", request.url, headers=headers, content=ask.body, extensions=request.extensions
        )

    def _failed(self, request: httpx.Request, ask: CodecAsk, response: httpx.Response) -> _Flow:
        """An error answer, read whole within `MAX_ERROR_BYTES`: a refusal of Codec is asked
        again as JSON; any other error is the SDK's, decoded, as it would have met it."""
        status = response.status_code
        try:
            error: bytes = (yield _Read(response, MAX_ERROR_BYTES)).data
        except ProxyError as exc:
            # Over the bound, or not in a coding it names: the status stands, in our words.
            message = (
                f"the server's {status} answer has an error body this client does not read: "
                f"{exc.message}"
            )
            unread = {"message": message, "type": "codec_client_error", "code": exc.code}
            return _decoded_error(response, orjson.dumps({"error": unread}))
        fallback = fallback_for(
            status, response.headers, error, remember_seconds=self._remember_seconds
        )
        if fallback is None:
            return _decoded_error(response, error)
        self._fall_back(request, ask, fallback)
        return self._passed((yield _Send(request)))

    def _rendered_body(
        self, request: httpx.Request, ask: CodecAsk, response: httpx.Response, answer: Frames
    ) -> _Part:
        decoder = self.assets.map(answer.map_digest)
        if decoder is None:
            read = yield from self._fetch(request, map_path_by_digest(answer.map_digest),
                                          MAX_MAP_BYTES)  # fmt: skip
            decoder = yield _LoadMap(answer.map_digest, read)
        dictionary = None
        if answer.dictionary_digest is not None:
            dictionary = self.assets.dictionary(answer.dictionary_digest)
            if dictionary is None:
                read = yield from self._fetch(request, dictionary_url(answer.dictionary_digest),
                                              MAX_DICTIONARY_BYTES)  # fmt: skip
                dictionary = self.assets.add_dictionary(
                    answer.dictionary_digest, read.data, sha256=read.sha256
                )
        # The proxy echoes the request's id (or names its own) in X-Request-Id.
        request_id = response.headers.get("x-request-id") or uuid.uuid4().hex
        created = int(self._wall_clock())
        return answer.body(ask, decoder, dictionary, request_id=request_id, created=created)

    def _fetch(self, request: httpx.Request, path: str, limit: int) -> _Part:
        """A discovery document, read whole within `limit`; `_Unavailable` when it cannot be."""
        # The discovery documents are open (no key needed, CORS-simple): no credentials go.
        timeout = request.extensions.get("timeout")
        response = yield _Send(
            httpx.Request(
                "GET",
                _origin(request.url) + path,
                headers={"Accept-Encoding": _DISCOVERY_CODINGS},
                extensions={"timeout": timeout} if timeout is not None else {},
            )
        )
        if response.status_code != 200:
            yield _Close(response)
            raise _Unavailable(f"discovery_{response.status_code}")
        try:
            return (yield _Read(response, limit))
        except ProxyError as exc:
            raise _Unavailable(f"discovery_{exc.code or 'unreadable'}") from exc


def _decoded_error(response: httpx.Response, body: bytes) -> httpx.Response:
    """An error answer with the body the transport read (decoded: no coding goes with it)."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _NOT_DECODED]
    return httpx.Response(
        response.status_code, headers=headers, content=body, extensions=response.extensions
    )


class CodecTransport(_CodecFlow, httpx.BaseTransport):
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
        flow = self._exchange(request, request.read())
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                response: httpx.Response = done.value
                return response
            try:
                reply, error = self._run(step), None
            except BaseException as exc:
                reply, error = None, exc

    def _run(self, step: _Step) -> Any:
        if isinstance(step, _Send):
            return self._inner.handle_request(step.request)
        if isinstance(step, _LoadMap):
            return self.assets.add_map(step.digest, step.body.data, sha256=step.body.sha256)
        try:
            if isinstance(step, _Read):
                reader = step.reader()
                for chunk in _sync_stream(step.response):
                    reader.feed(chunk)
                return reader.flush()
            return None  # _Close
        finally:
            step.response.close()

    def close(self) -> None:
        self._inner.close()

    def _passed(self, response: httpx.Response) -> httpx.Response:
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedStream(response, self.stats),
            extensions=response.extensions,
        )

    def _rendered(self, response: httpx.Response, rendering: _Rendering) -> httpx.SyncByteStream:
        return _RenderedStream(response, rendering)


class AsyncCodecTransport(_CodecFlow, httpx.AsyncBaseTransport):
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
        flow = self._exchange(request, await request.aread())
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                response: httpx.Response = done.value
                return response
            try:
                reply, error = await self._run(step), None
            except BaseException as exc:
                reply, error = None, exc

    async def _run(self, step: _Step) -> Any:
        if isinstance(step, _Send):
            return await self._inner.handle_async_request(step.request)
        if isinstance(step, _LoadMap):
            # Reading a map takes a tenth of a second (SmolLM2) to half a second (Llama-3):
            # not on the event loop.
            body = step.body
            return await anyio.to_thread.run_sync(
                lambda: self.assets.add_map(step.digest, body.data, sha256=body.sha256)
            )
        try:
            if isinstance(step, _Read):
                reader = step.reader()
                async for chunk in _async_stream(step.response):
                    reader.feed(chunk)
                return reader.flush()
            return None  # _Close
        finally:
            await step.response.aclose()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def _passed(self, response: httpx.Response) -> httpx.Response:
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncCountedStream(response, self.stats),
            extensions=response.extensions,
        )

    def _rendered(self, response: httpx.Response, rendering: _Rendering) -> httpx.AsyncByteStream:
        return _AsyncRenderedStream(response, rendering)


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


class _Rendering:
    """One Codec answer rendered as its body is read, for the sync and the async stream."""

    __slots__ = ("_body", "_digest", "_flow", "_rendered")

    def __init__(self, body: RenderedBody, digest: str, flow: _CodecFlow) -> None:
        self._body = body
        self._digest = digest
        self._flow = flow
        self._rendered = 0

    def feed(self, chunk: bytes) -> bytes:
        return self._out(self._body.feed(chunk))

    def flush(self) -> bytes:
        return self._out(self._body.flush())

    def closed(self) -> None:
        body = self._body
        self._flow.stats._codec(body.tokens, body.wire_bytes, self._rendered)

    def _out(self, data: bytes) -> bytes:
        self._rendered += len(data)
        if self._body.map_drift:
            # The answer's IDs went past its map's vocabulary: fetched again before it renders
            # another answer (proxy/core/client/answer.py).
            self._flow.assets.forget_map(self._digest)
        return data


class _RenderedStream(httpx.SyncByteStream):
    """The Codec body as it arrives, rendered. A broken connection raises as it would under a
    JSON stream (the SDK's APIConnectionError / APITimeoutError), after the text before it."""

    def __init__(self, response: httpx.Response, rendering: _Rendering) -> None:
        self._response = response
        self._rendering = rendering
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in _sync_stream(self._response):
            if out := self._rendering.feed(chunk):
                yield out
        if out := self._rendering.flush():
            yield out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.close()
            self._rendering.closed()


class _AsyncRenderedStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, rendering: _Rendering) -> None:
        self._response = response
        self._rendering = rendering
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in _async_stream(self._response):
            if out := self._rendering.feed(chunk):
                yield out
        if out := self._rendering.flush():
            yield out

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._response.aclose()
            self._rendering.closed()


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
