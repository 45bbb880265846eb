"""The coding a client gets: the smallest it accepts for the flush schedule, and dictionary
zstd only for clients that declared themselves Codec clients (core/http/content_coding.py).

A generic HTTP client is httpx itself: its default `Accept-Encoding` (`gzip, deflate, br, zstd`
with brotli and zstandard installed) and its own decoders, which know no Codec dictionary. The
Codec client is codecai: `Codec-Client-Version` from `with_codec_client_version`, the
dictionary picked by `select_zstd_dict_for_response`.
"""

from __future__ import annotations

import codecai
import httpx
import pytest

from proxy.core.http.content_coding import negotiate_coding
from proxy.core.http.versioning import parse_client_version
from proxy.server.models.live import LIVE
from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.compression_support import FORMATS, decompress_whole
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, app_of

CAPTURE = load_capture("llamacpp-completions-sample.txt")
EVERYTHING = "gzip, deflate, br, zstd"


def body(fmt: str) -> dict[str, object]:
    return {"prompt": "The capital of France is", "max_tokens": 32, "stream_format": fmt}


async def fetch_dictionary(proxy: ProxyClient, header: str) -> bytes:
    async with proxy.get(f"/.well-known/codec/dicts/{header.removeprefix('sha256:')}.zstd") as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("accept_encoding", [None, "zstd"])
async def test_a_generic_client_gets_a_coding_it_decodes_without_the_dictionary(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    fmt: str,
    accept_encoding: str | None,
) -> None:
    upstream.script = Script(CAPTURE, chunk_size=97)
    headers = {} if accept_encoding is None else {"Accept-Encoding": accept_encoding}
    async with httpx.AsyncClient() as client:
        response = await client.post(
            str(proxy.make_url("/v1/completions")), json=body(fmt), headers=headers
        )
    sent = response.request.headers["Accept-Encoding"]
    assert sent == (EVERYTHING if accept_encoding is None else accept_encoding)
    assert response.status_code == 200
    assert response.headers.get("Content-Encoding", "identity") != "zstd"
    assert "Codec-Zstd-Dict" not in response.headers
    if accept_encoding is None:
        assert response.headers["Content-Encoding"] == "gzip"  # the smallest at 50 ms
    # httpx's own decoders undid the coding (a dict-zstd body fails: "Dictionary mismatch").
    frames = await codecai_frames(response.content, fmt)
    assert render(codecai_map(smollm2_tokenizer), frames) == CAPTURE.stream_text()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("accept_encoding", [EVERYTHING, "zstd", "zstd, br", "br, gzip"])
async def test_a_codec_client_gets_the_smallest_coding_and_decodes_it(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    fmt: str,
    accept_encoding: str,
) -> None:
    upstream.script = Script(CAPTURE, chunk_size=97)
    headers = codecai.with_codec_client_version({"Accept-Encoding": accept_encoding})
    async with proxy.post(
        "/v1/completions", json=body(fmt), headers=headers, auto_decompress=False
    ) as resp:
        assert resp.status == 200
        response_headers = dict(resp.headers)
        wire = await resp.read()
    settings = app_of(proxy)[LIVE].current.settings
    expected = negotiate_coding(
        accept_encoding,
        stream_format=fmt,
        flush_interval_ms=settings.flush_interval_ms,
        flush_frames=settings.flush_frames,
        zstd_dictionary=True,
        codec_client=parse_client_version(headers["Codec-Client-Version"]).declared,
    )
    coding = response_headers.get("Content-Encoding", "identity")
    assert coding == expected
    if accept_encoding == EVERYTHING:
        assert coding == "gzip"
    if accept_encoding == "zstd":
        assert coding == "zstd"  # a Codec client still gets dictionary zstd
    loaded: dict[str, bytes] = {}
    if coding == "zstd":
        fetched = await fetch_dictionary(proxy, response_headers["Codec-Zstd-Dict"])
        loaded = {codecai.hash_zstd_dict(fetched): fetched}
    else:
        assert "Codec-Zstd-Dict" not in response_headers
    dictionary = codecai.select_zstd_dict_for_response(response_headers, loaded_dicts=loaded)
    frames = await codecai_frames(decompress_whole(coding, wire, dictionary), fmt)
    assert render(codecai_map(smollm2_tokenizer), frames) == CAPTURE.stream_text()


async def test_the_flush_schedule_decides(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    # Flushing every frame, dict-zstd costs more than identity sent frame by frame; at 250 ms it
    # is the smaller (coding_sizes.py, msgpack).
    got: dict[float, str] = {}
    for interval in (0.0, 250.0):
        proxy = await make_proxy(flush_interval_ms=interval)
        upstream.script = Script(CAPTURE)
        headers = codecai.with_codec_client_version({"Accept-Encoding": "zstd"})
        async with proxy.post(
            "/v1/completions", json=body("msgpack"), headers=headers, auto_decompress=False
        ) as resp:
            assert resp.status == 200
            got[interval] = resp.headers.get("Content-Encoding", "identity")
            await resp.read()
    assert got == {0.0: "identity", 250.0: "zstd"}
