"""Compression on every Codec route, the client-version rule for zstd, and coded request bodies
on chat and under a safety policy."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import codecai
import msgpack
import pytest

from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.compression_support import decompress_whole
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.policy_support import write_policy
from tests.server.support import post

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
CHAT_CAPTURE = load_capture("llamacpp-chat-sample.txt")
COMPLETION_CAPTURE = load_capture("llamacpp-completions-sample.txt")


async def fetch_dictionary(proxy: ProxyClient, header: str) -> bytes:
    async with proxy.get(f"/.well-known/codec/dicts/{header.removeprefix('sha256:')}.zstd") as r:
        return await r.read()


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
@pytest.mark.parametrize("route", ["chat", "path-b"])
async def test_chat_and_path_b_streams_are_compressed_too(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    coding: str,
    route: str,
) -> None:
    if route == "chat":
        upstream.script = Script(CHAT_CAPTURE, chunk_size=31)
        path, data = "/v1/chat/completions", json.dumps({**CHAT, "stream_format": "msgpack"})
        headers = {"Content-Type": "application/json"}
        text = CHAT_CAPTURE.stream_text(chat=True)
    else:
        upstream.script = Script(COMPLETION_CAPTURE, chunk_size=31)
        path, data = "/v1/completions/codec", msgpack.packb({"prompt_ids": [504, 3575]})
        headers = {"Content-Type": "application/x-msgpack"}
        text = COMPLETION_CAPTURE.stream_text()
    # A Codec client (zstd is for those only) insisting on the coding under test.
    headers = codecai.with_codec_client_version(headers)
    headers["Accept-Encoding"] = f"{coding}, identity;q=0"
    async with proxy.post(path, data=data, headers=headers, auto_decompress=False) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == coding
        wire, response_headers = await resp.read(), resp.headers
    dictionary = None
    if coding == "zstd":
        dictionary = await fetch_dictionary(proxy, response_headers["Codec-Zstd-Dict"])
    frames = await codecai_frames(decompress_whole(coding, wire, dictionary), "msgpack")
    assert render(codecai_map(smollm2_tokenizer), frames) == text


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.0", "identity"), ("0.1", "identity"), ("junk", "identity"), (None, "identity"),
     ("0.2", "zstd"), ("0.4", "zstd")],
)  # fmt: skip
async def test_zstd_only_for_declared_codec_clients(
    proxy: ProxyClient, upstream: FakeUpstream, version: str | None, expected: str
) -> None:
    # Dictionary zstd needs Codec-Zstd-Dict (floor 0.2, codec-spec.md §4) and a client that
    # holds the dictionary: one that said it is a Codec client. Without the header, `zstd` is
    # RFC 8878's, which a dictionary stream is not.
    headers = {"Accept-Encoding": "zstd"}
    if version is not None:
        headers["Codec-Client-Version"] = version
    body = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}
    async with proxy.post(
        "/v1/completions", json=body, headers=headers, auto_decompress=False
    ) as resp:
        assert resp.status == 200
        assert resp.headers.get("Content-Encoding", "identity") == expected
        assert ("Codec-Zstd-Dict" in resp.headers) == (expected == "zstd")
        await resp.read()


async def test_compressed_chat_json_goes_upstream_as_sent(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(CHAT_CAPTURE)
    wire = gzip.compress(json.dumps({**CHAT, "stream": True}).encode())
    status, _, _ = await post(
        proxy, "/v1/chat/completions", data=wire, headers={"Content-Encoding": "gzip"}
    )
    assert status == 200
    (sent,) = upstream.requests
    assert sent.body == wire
    assert sent.headers["Content-Encoding"] == "gzip"


async def test_policed_json_sends_the_decoded_body_without_its_coding(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(safety_policy=write_policy(tmp_path))
    upstream.script = Script(COMPLETION_CAPTURE)
    plain = json.dumps({"prompt": "Hi", "max_tokens": 8, "stream": True}).encode()
    status, _, _ = await post(
        proxy, "/v1/completions", data=gzip.compress(plain), headers={"Content-Encoding": "gzip"}
    )
    assert status == 200
    (sent,) = upstream.requests
    assert sent.body == plain
    assert "Content-Encoding" not in sent.headers
