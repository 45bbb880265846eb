"""Compressed JSON responses (`json_compression = "on"`) through the proxy, from real captures.

Bodies are decompressed with the standard libraries, as they arrive; what they decode to must
be the very bytes the upstream sent (or the safety policy's, on the policed path), the flush
schedule must hold with a stalled upstream, and what the proxy must not compress goes out as it
came.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import json
import random
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from multidict import CIMultiDictProxy

import proxy.server.control.json_compression as json_compression_module
from proxy.server.models.live import LIVE
from proxy.server.process.reload import reload
from tests.compression_support import decompress_whole, incremental_decompressor
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, app_of
from tests.server.policy_support import policy_document, v04, write_policy

# What the data plane does with a stream, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

JSON_CODINGS = ("gzip", "br", "zstd")
STREAMS = (
    ("/v1/completions", "llamacpp-completions-sample.txt"),
    ("/v1/completions", "vllm-completions-sample.txt"),
    ("/v1/chat/completions", "vllm-chat.txt"),
    ("/v1/chat/completions", "llamacpp-chat-sample.txt"),
)
STREAM_BODY: dict[str, Any] = {
    "prompt": "The capital of France is",
    "max_tokens": 32,
    "stream": True,
}
CHAT_BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
COMPLETION = {
    "id": "cmpl-826f5e977a72f916",
    "object": "text_completion",
    "created": 1795977989,
    "model": "smollm2",
    "choices": [{"index": 0, "text": " Paris. " * 40, "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 32, "total_tokens": 37},
}
WHOLE_BODY = json.dumps(COMPLETION).encode()


def json_capture(body: bytes = WHOLE_BODY, *headers: tuple[str, str], status: int = 200) -> Capture:
    reason = {200: "OK", 204: "No Content", 400: "Bad Request"}[status]
    return Capture(status, reason, (("Content-Type", "application/json"), *headers), body)


@pytest.fixture
async def compressing(make_proxy: MakeProxy) -> ProxyClient:
    return await make_proxy(json_compression="on")


async def fetch(
    proxy: ProxyClient,
    accept_encoding: str | None,
    *,
    path: str = "/v1/completions",
    payload: dict[str, Any] | None = None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, CIMultiDictProxy[str], bytes]:
    """One request with exactly this `Accept-Encoding` (None: none at all); the body as it
    came over the wire."""
    sent = dict(headers or {})
    skip: list[str] = []
    if accept_encoding is None:
        skip.append("Accept-Encoding")
    else:
        sent["Accept-Encoding"] = accept_encoding
    async with proxy.request(
        method,
        path,
        json=STREAM_BODY if payload is None and method == "POST" else payload,
        headers=sent,
        skip_auto_headers=skip,
        auto_decompress=False,
    ) as resp:
        return resp.status, resp.headers, await resp.read()


def vary(headers: CIMultiDictProxy[str]) -> list[str]:
    return [t.strip().lower() for v in headers.getall("Vary", []) for t in v.split(",")]


# --- every coding, every stream --------------------------------------------------------------


@pytest.mark.parametrize(("path", "capture_name"), STREAMS)
@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_decoded_stream_is_the_upstream_stream(
    compressing: ProxyClient, upstream: FakeUpstream, path: str, capture_name: str, coding: str
) -> None:
    capture = load_capture(capture_name)
    upstream.script = Script(capture, chunk_size=97)
    payload = CHAT_BODY if "chat" in path else STREAM_BODY
    # The client's preference is not the proxy's: a client that takes all three gets the
    # smallest, so each is asked for alone.
    status, headers, wire = await fetch(compressing, coding, path=path, payload=payload)
    assert status == 200
    assert headers["Content-Encoding"] == coding
    assert headers["Content-Type"].startswith("text/event-stream")
    assert "accept-encoding" in vary(headers)
    assert "Content-Length" not in headers
    assert decompress_whole(coding, wire) == capture.body
    assert len(wire) < len(capture.body) / 2
    # The upstream was asked as the client asked: the proxy compresses what came plain.
    assert upstream.requests[0].headers["Accept-Encoding"] == coding


async def test_upstream_vary_is_kept_and_extended(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("vllm-completions-sample.txt"))  # `vary: Origin`
    _, headers, _ = await fetch(compressing, "gzip")
    assert headers.getall("Vary") == ["Origin, Accept-Encoding"]


async def test_a_client_offering_everything_gets_gzip(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    # httpx's default with brotli and zstandard installed; gzip is the smallest at the
    # default flush schedule (core/http/coding_sizes.py, the JSON row).
    upstream.script = Script(load_capture("vllm-completions-sample.txt"))
    _, headers, _ = await fetch(compressing, "gzip, deflate, br, zstd")
    assert headers["Content-Encoding"] == "gzip"


@pytest.mark.parametrize(
    ("accept_encoding", "expected"),
    [
        ("gzip;q=0, br", "br"),
        ("x-gzip", "gzip"),
        ("*", "gzip"),
        ("zstd", "zstd"),
    ],
)
async def test_the_coding_is_one_the_client_accepts(
    compressing: ProxyClient, upstream: FakeUpstream, accept_encoding: str, expected: str
) -> None:
    upstream.script = Script(load_capture("vllm-completions-sample.txt"))
    _, headers, wire = await fetch(compressing, accept_encoding)
    assert headers["Content-Encoding"] == expected
    assert decompress_whole(expected, wire) == upstream.script.capture.body


@pytest.mark.parametrize(
    "accept_encoding", [None, "identity", "deflate", "compress", "gzip;q=0", "*;q=0", ""]
)
async def test_a_client_that_takes_no_coding_we_send_gets_the_upstream_bytes(
    compressing: ProxyClient, upstream: FakeUpstream, accept_encoding: str | None
) -> None:
    capture = load_capture("vllm-completions-sample.txt")
    upstream.script = Script(capture)
    status, headers, wire = await fetch(compressing, accept_encoding)
    # Never refused (JSON went out whatever a client accepted), and never coded.
    assert status == 200
    assert "Content-Encoding" not in headers
    assert wire == capture.body
    # Another Accept-Encoding would have got other bytes.
    assert "accept-encoding" in vary(headers)


async def test_off_by_default(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    capture = load_capture("vllm-completions-sample.txt")
    upstream.script = Script(capture)
    _, headers, wire = await fetch(proxy, "gzip, deflate")
    assert "Content-Encoding" not in headers
    assert headers.getall("Vary") == ["Origin"]
    assert wire == capture.body


# --- flushing: at event ends, first at once, then within the interval ----------------------


async def read_events(
    proxy: ProxyClient, coding: str, after_stall: Any
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(events decodable in time, all events, what each arrival decoded to). `after_stall()`
    gives the deadline for 'in time' once the upstream stalled (None before)."""
    decompress = incremental_decompressor(coding)
    loop = asyncio.get_running_loop()
    decoded = b""
    pieces: list[bytes] = []
    in_time: list[bytes] = []
    headers = {"Accept-Encoding": coding}
    async with proxy.post(
        "/v1/completions", json=STREAM_BODY, headers=headers, auto_decompress=False
    ) as resp:
        assert resp.headers["Content-Encoding"] == coding
        async for chunk in resp.content.iter_any():
            piece = decompress(chunk)
            pieces.append(piece)
            decoded += piece
            deadline = after_stall()
            if deadline is None or loop.time() <= deadline:
                in_time = events_of(decoded)
    return in_time, events_of(decoded), pieces


def events_of(data: bytes) -> list[bytes]:
    """The complete events in `data`."""
    return [e + b"\n\n" for e in data.split(b"\n\n")[:-1]]


@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_every_flush_ends_at_an_event_end(
    make_proxy: MakeProxy, upstream: FakeUpstream, coding: str
) -> None:
    # Every event is flushed (interval 0), and the upstream's chunks cut events anywhere: still,
    # nothing the client decodes ends in the middle of an event.
    proxy = await make_proxy(json_compression="on", flush_interval_ms=0.0)
    capture = load_capture("llamacpp-completions-sample.txt")
    # Pieces of about a third of an event, apart in time so that they arrive apart.
    upstream.script = Script(capture, chunk_size=100, delay=0.003)
    _, events, pieces = await read_events(proxy, coding, lambda: None)
    assert b"".join(events) == capture.body
    decoded = b""
    for piece in pieces:
        decoded += piece
        assert decoded.endswith(b"\n\n") or not decoded
    assert sum(1 for piece in pieces if piece) > len(capture.events) / 2


STALL_SECONDS = 2.0
MARGIN_SECONDS = 0.75  # generous: the property is "within the interval", not a benchmark


@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_a_stalled_upstream_still_gets_pending_events_out_within_the_interval(
    make_proxy: MakeProxy, upstream: FakeUpstream, coding: str
) -> None:
    interval_ms = 100.0
    # flush_frames far away: only the timer can flush the events before the stall.
    proxy = await make_proxy(
        json_compression="on", flush_interval_ms=interval_ms, flush_frames=1000
    )
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, stall_after_events=12, stall_seconds=STALL_SECONDS)

    def deadline() -> float | None:
        if not upstream.stalled_at:
            return None
        return upstream.stalled_at[0] + interval_ms / 1000 + MARGIN_SECONDS

    in_time, events, _ = await read_events(proxy, coding, deadline)
    assert events == capture.events
    assert in_time == capture.events[:12]
    assert MARGIN_SECONDS + interval_ms / 1000 < STALL_SECONDS / 2


@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_the_first_event_is_flushed_at_once(
    make_proxy: MakeProxy, upstream: FakeUpstream, coding: str
) -> None:
    # A one-minute interval: only the first-event rule can deliver anything before the stall
    # ends.
    proxy = await make_proxy(json_compression="on", flush_interval_ms=60_000.0, flush_frames=1000)
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, stall_after_events=1, stall_seconds=STALL_SECONDS)

    def deadline() -> float | None:
        return upstream.stalled_at[0] + MARGIN_SECONDS if upstream.stalled_at else None

    in_time, events, _ = await read_events(proxy, coding, deadline)
    assert in_time == capture.events[:1]
    assert events == capture.events


async def test_flush_frames_bounds_the_window_in_events(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(json_compression="on", flush_interval_ms=60_000.0, flush_frames=3)
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, stall_after_events=9, stall_seconds=STALL_SECONDS)

    def deadline() -> float | None:
        return upstream.stalled_at[0] + MARGIN_SECONDS if upstream.stalled_at else None

    in_time, _, _ = await read_events(proxy, "gzip", deadline)
    # The first at once, then whenever a third is pending: at most two of the nine events
    # before the stall wait for a third (fewer when a read brought several at once: what one
    # read brings is fed, and flushed, together).
    assert in_time == capture.events[: len(in_time)]
    assert 7 <= len(in_time) <= 9


# --- whole bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_a_whole_body_is_compressed_whole_with_its_length(
    compressing: ProxyClient, upstream: FakeUpstream, coding: str
) -> None:
    upstream.script = Script(json_capture(WHOLE_BODY, ("ETag", '"v1"')))
    status, headers, wire = await fetch(compressing, coding, payload={"prompt": "x"})
    assert status == 200
    assert headers["Content-Encoding"] == coding
    assert headers["Content-Length"] == str(len(wire))
    assert decompress_whole(coding, wire) == WHOLE_BODY
    assert len(wire) < len(WHOLE_BODY) / 2
    assert "accept-encoding" in vary(headers)
    # Another representation of the same content: the validator is weak now.
    assert headers["ETag"] == 'W/"v1"'


async def test_a_large_whole_body_is_streamed_on_without_a_length(
    compressing: ProxyClient, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_compression_module, "WHOLE_BODY_BYTES", 16 * 1024)
    # Random text does not compress: the compressor has output long before the end.
    noise = base64.b64encode(random.Random(0).randbytes(200_000)).decode()
    large = json.dumps({"data": [{"embedding": noise}]}).encode()
    upstream.script = Script(json_capture(large))
    status, headers, wire = await fetch(compressing, "gzip", payload={"prompt": "x"})
    assert status == 200
    assert headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in headers
    assert gzip.decompress(wire) == large


async def test_a_whole_body_for_a_client_without_accept_encoding_keeps_its_length(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(json_capture())
    _, headers, wire = await fetch(compressing, None, payload={"prompt": "x"})
    assert wire == WHOLE_BODY
    assert headers["Content-Length"] == str(len(WHOLE_BODY))
    assert "accept-encoding" in vary(headers)


# --- what is left as it came ----------------------------------------------------------------


async def test_an_upstream_compressed_body_passes_untouched(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    coded = gzip.compress(WHOLE_BODY)
    upstream.script = Script(json_capture(coded, ("Content-Encoding", "gzip")))
    _, headers, wire = await fetch(compressing, "gzip, br, zstd", payload={"prompt": "x"})
    assert wire == coded  # not coded twice, not re-coded
    assert headers.getall("Content-Encoding") == ["gzip"]
    assert headers["Content-Length"] == str(len(coded))
    assert "Vary" not in headers


async def test_no_transform_is_respected(compressing: ProxyClient, upstream: FakeUpstream) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    headers = (*capture.headers, ("Cache-Control", "no-cache, no-transform"))
    upstream.script = Script(Capture(200, "OK", headers, capture.body))
    _, got, wire = await fetch(compressing, "gzip")
    assert "Content-Encoding" not in got
    assert wire == capture.body


@pytest.mark.parametrize(
    "capture",
    [load_capture("llamacpp-completions-sample.txt"), json_capture()],
    ids=["streamed", "whole"],
)
@pytest.mark.parametrize("cache_control", ["no-transform", "max-age=0, No-Transform"])
async def test_a_clients_no_transform_is_respected(
    compressing: ProxyClient, upstream: FakeUpstream, capture: Capture, cache_control: str
) -> None:
    # RFC 9111 §5.2.1.6: the client asks intermediaries not to transform the content.
    upstream.script = Script(capture)
    payload = {**STREAM_BODY, "stream": capture.is_sse}
    headers = {"Cache-Control": cache_control}
    status, got, wire = await fetch(compressing, "gzip", payload=payload, headers=headers)
    assert status == 200
    assert "Content-Encoding" not in got
    assert wire == capture.body
    # The same request without it is compressed.
    _, got, wire = await fetch(compressing, "gzip", payload=payload)
    assert got["Content-Encoding"] == "gzip"
    assert gzip.decompress(wire) == capture.body


@pytest.mark.parametrize(
    "capture_name", ["llamacpp-error-tools-500.txt", "llamacpp-error-embeddings-501.txt"]
)
async def test_errors_pass_as_they_came(
    compressing: ProxyClient, upstream: FakeUpstream, capture_name: str
) -> None:
    capture = load_capture(capture_name)
    assert capture.status >= 400
    upstream.script = Script(capture)
    status, headers, wire = await fetch(compressing, "gzip")
    assert status == capture.status
    assert "Content-Encoding" not in headers
    assert wire == capture.body


async def test_no_content_is_not_coded(compressing: ProxyClient, upstream: FakeUpstream) -> None:
    upstream.script = Script(json_capture(b"", status=204))
    status, headers, wire = await fetch(compressing, "gzip", payload={"prompt": "x"})
    assert status == 204
    assert wire == b""
    assert "Content-Encoding" not in headers
    assert "Vary" not in headers


async def test_head_gets_the_headers_its_get_would_get(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(json_capture())
    status, headers, wire = await fetch(compressing, "gzip", method="GET", path="/v1/anything")
    assert (status, headers["Content-Encoding"]) == (200, "gzip")
    status, head_headers, nothing = await fetch(
        compressing, "gzip", method="HEAD", path="/v1/anything"
    )
    assert status == 200
    assert nothing == b""
    assert head_headers["Content-Encoding"] == "gzip"
    assert "accept-encoding" in vary(head_headers)
    # Known only once the content is compressed: left out (RFC 9110 §9.3.2), not the
    # upstream's identity length, and no chunked body promised either.
    assert "Content-Length" not in head_headers
    assert "Transfer-Encoding" not in head_headers
    assert [r.method for r in upstream.requests] == ["GET", "HEAD"]
    # The connection is still good for the next request.
    status, _, wire = await fetch(compressing, "gzip", method="GET", path="/v1/anything")
    assert gzip.decompress(wire) == WHOLE_BODY


async def test_a_broken_upstream_stream_is_not_ended_as_if_whole(
    compressing: ProxyClient, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, drop_after_events=5)
    # The connection is closed mid-body: the client sees a broken body, never a whole one.
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(compressing, "gzip")


# --- the policed path, the rollout switches ------------------------------------------------


@pytest.fixture
async def policed(make_proxy: MakeProxy, tmp_path: Path) -> tuple[ProxyClient, ProxyClient]:
    """The same policy with json_compression on and off."""
    path = write_policy(tmp_path)
    return (
        await make_proxy(safety_policy=path, json_compression="on"),
        await make_proxy(safety_policy=path),
    )


@pytest.mark.parametrize("coding", JSON_CODINGS)
async def test_a_policed_stream_decodes_to_the_policed_identity_stream(
    policed: tuple[ProxyClient, ProxyClient], upstream: FakeUpstream, coding: str
) -> None:
    on, off = policed
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, chunk_size=61)
    _, plain_headers, plain = await fetch(off, coding, headers=v04())
    # The policy's stop rule fires on this capture: the stream ends early, its compression
    # with it, with no flush from the upstream's end.
    assert b"content_filter" in plain
    upstream.script = Script(capture, chunk_size=61)
    status, headers, wire = await fetch(on, coding, headers=v04())
    assert status == 200
    assert headers["Content-Encoding"] == coding
    assert headers["Codec-Safety-Policy"] == plain_headers["Codec-Safety-Policy"]
    assert set(vary(headers)) == {"codec-client-version", "accept-encoding"}
    assert decompress_whole(coding, wire) == plain


async def test_a_policed_whole_body_is_compressed(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy = await make_proxy(
        safety_policy=write_policy(tmp_path, policy_document("Atlantis")), json_compression="on"
    )
    upstream.script = Script(json_capture())
    status, headers, wire = await fetch(proxy, "br", payload={"prompt": "x"}, headers=v04())
    assert status == 200
    assert headers["Content-Encoding"] == "br"
    assert headers["Content-Length"] == str(len(wire))
    assert json.loads(decompress_whole("br", wire))["choices"] == COMPLETION["choices"]
    # The policy read the text: the upstream was asked for it plain.
    assert upstream.requests[0].headers["Accept-Encoding"] == "identity"


@pytest.mark.parametrize(
    "switches",
    [
        {"codec_enabled": False},
        {"codec_allow_keys": ("someone-else",)},
        {"codec_client_header": "X-Client", "codec_deny_clients": ("my-app",)},
        {"version_policy": "strict"},
    ],
)
async def test_json_is_compressed_under_every_rollout_switch(
    make_proxy: MakeProxy, upstream: FakeUpstream, switches: dict[str, Any]
) -> None:
    proxy = await make_proxy(json_compression="on", **switches)
    capture = load_capture("vllm-completions-sample.txt")
    upstream.script = Script(capture)
    status, headers, wire = await fetch(proxy, "gzip", headers={"X-Client": "my-app"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(wire) == capture.body


async def test_a_reload_turns_it_on_and_off_for_the_next_request(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    capture = load_capture("vllm-completions-sample.txt")
    app = app_of(proxy)
    steps: tuple[tuple[Literal["on", "off"], str], ...] = (("on", "gzip"), ("off", "identity"))
    for setting, expected in steps:
        live = app[LIVE].current.settings
        result = await reload(app, dataclasses.replace(live, json_compression=setting))
        assert result.ok
        assert result.changed == ("json_compression",)
        upstream.script = Script(capture)
        _, headers, wire = await fetch(proxy, "gzip")
        assert headers.get("Content-Encoding", "identity") == expected
        assert decompress_whole(expected, wire) == capture.body
