"""Decompress responses with the standard libraries, incrementally, as a client does: Codec
streams (zstd with the format's dictionary) and JSON (plain zstd)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable

import brotli
import httpx2
import zstandard

from proxy.core.compression.dictionaries import ZstdDictionaries
from proxy.dictionaries.load import load_dictionaries
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST

CODINGS = ("identity", "gzip", "br", "zstd")
FORMATS = ("msgpack", "protobuf")


def shipped_dictionaries() -> ZstdDictionaries:
    """The dictionaries in dictionaries/manifest.json, verified as the proxy verifies them."""
    return load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST, manifest_required=True)


def incremental_decompressor(
    coding: str, dictionary: bytes | None = None
) -> Callable[[bytes], bytes]:
    """Feed compressed bytes as they arrive; get the decompressed bytes they complete."""
    if coding == "gzip":
        return zlib.decompressobj(wbits=31).decompress
    if coding == "br":
        process: Callable[[bytes], bytes] = brotli.Decompressor().process
        return process
    if coding == "zstd":
        # Without a dictionary: plain zstd, as JSON responses are sent.
        zdict = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
        decompress: Callable[[bytes], bytes] = (
            zstandard.ZstdDecompressor(dict_data=zdict).decompressobj().decompress
        )
        return decompress
    assert coding == "identity", coding
    return bytes


def decompress_whole(coding: str, body: bytes, dictionary: bytes | None = None) -> bytes:
    """The standard libraries' one-shot decoders (they also check the stream is complete)."""
    if coding == "gzip":
        return zlib.decompress(body, wbits=31)
    if coding == "br":
        out: bytes = brotli.decompress(body)
        return out
    if coding == "zstd":
        zdict = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
        with zstandard.ZstdDecompressor(dict_data=zdict).stream_reader(body) as reader:
            whole: bytes = reader.read()
        return whole
    return body


class WireCounter(httpx2.AsyncBaseTransport):
    """The OpenAI SDK's own HTTP transport (httpx2's), counting response body bytes as they
    came over the wire, before the client decodes any content coding."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.bytes = 0
        self.offered: list[str] = []
        self.encodings: list[str] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.offered.append(request.headers.get("Accept-Encoding", ""))
        response = await self._inner.handle_async_request(request)
        self.encodings.append(response.headers.get("Content-Encoding", "identity"))
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Counted(response.stream, self),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Counted(httpx2.AsyncByteStream):
    def __init__(
        self, stream: httpx2.AsyncByteStream | httpx2.SyncByteStream, counter: WireCounter
    ) -> None:
        assert isinstance(stream, httpx2.AsyncByteStream)
        self._stream = stream
        self._counter = counter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._counter.bytes += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()
