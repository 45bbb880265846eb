"""Compressed Codec streams through the proxy, from real captured upstream streams.

Bodies are decompressed with the standard libraries (zlib, brotli, zstandard with the
dictionary fetched from the proxy's well-known URL, picked by codecai's
`select_zstd_dict_for_response`), then decoded by codecai and rendered to text.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections.abc import Callable

import brotli
import codecai
import pytest
import zstandard
from aiohttp import web

from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.decoder import FrameDecoder
from proxy.tokenizers import LoadedTokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests.codec_client import codecai_frames, codecai_map, render
from tests.compression_support import (
    CODINGS,
    FORMATS,
    decompress_whole,
    incremental_decompressor,
)
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, default_model

# What the data plane does with a stream, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

VARY = "Accept-Encoding, Codec-Client-Version"


def body(fmt: str = "msgpack", **extra: object) -> dict[str, object]:
    return {"prompt": "The capital of France is", "max_tokens": 32, "stream_format": fmt, **extra}


async def fetch_dictionary(proxy: ProxyClient, header: str) -> bytes:
    """What a client does on an unknown `Codec-Zstd-Dict`: fetch it from the well-known URL."""
    hex_digest = header.removeprefix("sha256:")
    async with proxy.get(f"/.well-known/codec/dicts/{hex_digest}.zstd") as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        data = await resp.read()
    assert hashlib.sha256(data).hexdigest() == hex_digest
    return data


def insisting_on(coding: str) -> str:
    """`Accept-Encoding` for exactly this coding: the proxy would otherwise pick the smallest
    acceptable one, identity included (core/http/content_coding.py)."""
    return coding if coding == "identity" else f"{coding}, identity;q=0"


async def post_raw(
    proxy: ProxyClient, payload: dict[str, object], accept_encoding: str
) -> tuple[int, dict[str, str], bytes]:
    """POST as a Codec client (codecai's `Codec-Client-Version`, so zstd is possible)."""
    headers = codecai.with_codec_client_version({"Accept-Encoding": accept_encoding})
    async with proxy.post(
        "/v1/completions", json=payload, headers=headers, auto_decompress=False
    ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize(
    "capture_name", ["llamacpp-completions-sample.txt", "vllm-completions-sample.txt"]
)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", CODINGS)
async def test_decompressed_stream_is_the_identity_stream(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    capture_name: str,
    fmt: str,
    coding: str,
) -> None:
    capture = load_capture(capture_name)
    upstream.script = Script(capture, chunk_size=97)
    status, headers, wire = await post_raw(proxy, body(fmt), insisting_on(coding))
    assert status == 200
    assert headers["Vary"] == VARY
    assert headers.get("Content-Encoding", "identity") == coding
    dictionary = None
    if coding == "zstd":
        dictionary = await fetch_dictionary(proxy, headers["Codec-Zstd-Dict"])
    else:
        assert "Codec-Zstd-Dict" not in headers
    # codecai accepts our headers: the dictionary for zstd, none otherwise.
    loaded = {codecai.hash_zstd_dict(dictionary): dictionary} if dictionary else {}
    assert codecai.select_zstd_dict_for_response(headers, loaded_dicts=loaded) == dictionary
    identity = decompress_whole(coding, wire, dictionary)
    frames = await codecai_frames(identity, fmt)
    assert render(codecai_map(smollm2_tokenizer), frames) == capture.stream_text()
    # The identity response to the same request carries the same IDs.
    upstream.script = Script(capture, chunk_size=97)
    _, _, plain = await post_raw(proxy, body(fmt), "identity")
    plain_ids = [i for f in FrameDecoder(fmt).feed(plain) for i in f.ids]  # type: ignore[arg-type]
    assert [i for f in frames for i in f.ids] == plain_ids


async def test_zstd_only_with_a_dictionary_for_the_format(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(dictionaries_manifest=None)
    status, headers, _ = await post_raw(proxy, body(), insisting_on("zstd") + ", br")
    assert status == 200
    assert headers["Content-Encoding"] == "br"
    assert "Codec-Zstd-Dict" not in headers
    status, _, _ = await post_raw(proxy, body(), insisting_on("zstd"))
    assert status == 406


@pytest.mark.parametrize("accept_encoding", ["identity;q=0", "*;q=0", "zstd;q=0, identity;q=0"])
async def test_nothing_acceptable_is_406_json(
    proxy: ProxyClient, upstream: FakeUpstream, accept_encoding: str
) -> None:
    status, headers, raw = await post_raw(proxy, body(), accept_encoding)
    assert status == 406
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(raw)["error"]["code"] == "no_acceptable_encoding"
    assert upstream.requests == []  # decided before the upstream is asked


async def test_json_pass_through_is_never_recompressed(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    capture = load_capture("vllm-completions-sample.txt")
    upstream.script = Script(capture)
    raw = json.dumps({"prompt": "Hi", "stream": True}).encode()
    async with proxy.post(
        "/v1/completions",
        data=raw,
        headers={"Accept-Encoding": "zstd, br;q=0.5, gzip"},
        auto_decompress=False,
    ) as resp:
        assert "Content-Encoding" not in resp.headers
        assert await resp.read() == capture.body
    assert upstream.requests[0].headers["Accept-Encoding"] == "zstd, br;q=0.5, gzip"


# --- flushing in time -----------------------------------------------------------------------


def pre_stall_ids(vocabulary: Vocabulary, events: list[bytes]) -> int:
    """How many IDs the transcoder emits for these events (what must arrive during a stall)."""
    transcoder = CodecTranscoder(vocabulary.scheme, parse_completion_chunk)
    return sum(len(frame.ids) for event in events for frame in transcoder.feed(event))


async def decodable_by(
    proxy: ProxyClient, fmt: str, coding: str, deadline_after_stall: Callable[[], float | None]
) -> tuple[int, int]:
    """(IDs decodable before the deadline, all IDs). Reads and decodes as bytes arrive."""
    dictionary = None
    if coding == "zstd":
        loaded = default_model(proxy).dictionaries.for_format(fmt)
        assert loaded is not None
        dictionary = loaded.data
    decompress = incremental_decompressor(coding, dictionary)
    decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    in_time = total = 0
    headers = codecai.with_codec_client_version({"Accept-Encoding": insisting_on(coding)})
    async with proxy.post(
        "/v1/completions", json=body(fmt), headers=headers, auto_decompress=False
    ) as resp:
        assert resp.headers.get("Content-Encoding", "identity") == coding
        async for chunk in resp.content.iter_any():
            ids = sum(len(f.ids) for f in decoder.feed(decompress(chunk)))
            total += ids
            deadline = deadline_after_stall()
            if deadline is None or loop.time() <= deadline:
                in_time += ids
    return in_time, total


STALL_SECONDS = 2.0
MARGIN_SECONDS = 0.75  # generous: the property is "within the interval", not a benchmark


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("coding", CODINGS)
async def test_stalled_upstream_still_delivers_pending_frames_within_the_interval(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    smollm2_vocabulary: Vocabulary,
    fmt: str,
    coding: str,
) -> None:
    interval_ms = 100.0
    # flush_frames far away: only the timer can flush the frames before the stall.
    proxy = await make_proxy(flush_interval_ms=interval_ms, flush_frames=1000)
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, stall_after_events=12, stall_seconds=STALL_SECONDS)

    def deadline() -> float | None:
        if not upstream.stalled_at:
            return None
        return upstream.stalled_at[0] + interval_ms / 1000 + MARGIN_SECONDS

    in_time, total = await decodable_by(proxy, fmt, coding, deadline)
    expected = pre_stall_ids(smollm2_vocabulary, capture.events[:12])
    assert expected > 5
    assert total > expected
    # Every ID the first 12 events produced was decodable long before the stall ended.
    assert in_time >= expected
    assert MARGIN_SECONDS + interval_ms / 1000 < STALL_SECONDS / 2


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_first_frame_is_flushed_at_once(
    make_proxy: MakeProxy, upstream: FakeUpstream, smollm2_vocabulary: Vocabulary, coding: str
) -> None:
    # A one-minute interval: only the first-frame rule can deliver anything before the stall
    # ends. The upstream stalls right after the first event that yields an ID (the
    # retokenizer holds back a trailing word until the next delta).
    proxy = await make_proxy(flush_interval_ms=60_000.0, flush_frames=1000)
    capture = load_capture("llamacpp-completions-sample.txt")
    events = capture.events
    first_yielding = next(
        k for k in range(1, len(events)) if pre_stall_ids(smollm2_vocabulary, events[:k])
    )
    upstream.script = Script(
        capture, stall_after_events=first_yielding, stall_seconds=STALL_SECONDS
    )

    def deadline() -> float | None:
        return upstream.stalled_at[0] + MARGIN_SECONDS if upstream.stalled_at else None

    in_time, total = await decodable_by(proxy, "msgpack", coding, deadline)
    first = pre_stall_ids(smollm2_vocabulary, events[:first_yielding])
    assert in_time >= first  # the first frame arrived while the upstream was quiet
    assert total > in_time


async def test_flush_frames_bounds_the_window(
    make_proxy: MakeProxy, upstream: FakeUpstream, smollm2_vocabulary: Vocabulary
) -> None:
    proxy = await make_proxy(flush_interval_ms=60_000.0, flush_frames=2)
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, stall_after_events=9, stall_seconds=STALL_SECONDS)

    def deadline() -> float | None:
        return upstream.stalled_at[0] + MARGIN_SECONDS if upstream.stalled_at else None

    in_time, _ = await decodable_by(proxy, "protobuf", "br", deadline)
    # At most one frame (the odd one out) can still wait for a partner.
    transcoder = CodecTranscoder(smollm2_vocabulary.scheme, parse_completion_chunk)
    per_event = [sum(len(f.ids) for f in transcoder.feed(e)) for e in capture.events[:9]]
    assert in_time >= sum(per_event) - max(per_event)


# --- the dictionaries' URL ------------------------------------------------------------------


async def test_dictionaries_are_served_by_hash(proxy: ProxyClient) -> None:
    records = default_model(proxy).dictionaries.records
    assert [r.format for r in records] == ["msgpack", "protobuf"]
    for record in records:
        async with proxy.get(record.url) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "application/octet-stream"
            data = await resp.read()
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == record.hash
        assert len(data) == record.size_bytes
    for missing in ("0" * 64 + ".zstd", "abc.zstd", records[0].hash[7:]):
        async with proxy.get(f"/.well-known/codec/dicts/{missing}") as resp:
            assert resp.status == 404


# --- compressed request bodies ---------------------------------------------------------------

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


@pytest.mark.parametrize("coding", sorted(COMPRESS))
async def test_compressed_codec_request_bodies(
    proxy: ProxyClient, upstream: FakeUpstream, coding: str
) -> None:
    raw = json.dumps(body("protobuf", prompt=[1, 2, 3])).encode()
    async with proxy.post(
        "/v1/completions",
        data=COMPRESS[coding](raw),
        headers={"Content-Encoding": coding, "Content-Type": "application/json"},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/x-protobuf"
    (sent,) = upstream.requests
    assert json.loads(sent.body)["prompt"] == [1, 2, 3]
    assert "Content-Encoding" not in sent.headers  # we sent our own, plain body


async def test_compressed_json_request_goes_upstream_as_sent(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("vllm-completions-sample.txt"))
    wire = gzip.compress(json.dumps({"prompt": "Hi", "stream": True}).encode())
    async with proxy.post(
        "/v1/completions", data=wire, headers={"Content-Encoding": "gzip"}
    ) as resp:
        assert resp.status == 200
    (sent,) = upstream.requests
    assert sent.body == wire  # not decoded, not re-encoded
    assert sent.headers["Content-Encoding"] == "gzip"


async def test_request_decompression_bomb_is_413(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(max_body_bytes=64 * 1024)
    bomb = gzip.compress(b'{"prompt": "' + b" " * (50 << 20) + b'"}', compresslevel=9)
    assert len(bomb) < 64 * 1024
    async with proxy.post(
        "/v1/completions", data=bomb, headers={"Content-Encoding": "gzip"}
    ) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "body_too_large"
    assert upstream.requests == []


async def test_unknown_request_coding_is_415(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    async with proxy.post(
        "/v1/completions", data=b"{}", headers={"Content-Encoding": "deflate"}
    ) as resp:
        assert resp.status == 415
        assert (await resp.json())["error"]["code"] == "unsupported_content_encoding"
    assert upstream.requests == []


async def test_dictionary_route_is_not_relayed(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    async with proxy.get("/.well-known/codec/dicts/" + "f" * 64 + ".zstd") as resp:
        assert resp.status == 404
    assert upstream.requests == []


def test_app_key_holds_the_records_for_the_tokenizer_map(proxy: ProxyClient) -> None:
    app: web.Application = proxy.app
    entries = [r.to_json() for r in default_model(app).dictionaries.records]
    assert {tuple(sorted(e)) for e in entries} == {
        ("corpus_summary", "format", "hash", "size_bytes", "trained_at", "url")
    }
