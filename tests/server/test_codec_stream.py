"""Codec streams on /v1/completions, from real captured llama.cpp and vLLM upstream streams.

The reference client `codecai` decodes every stream, and a Detokenizer built from our tokenizer
must render exactly the text the upstream generated.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from proxy.core.bodies import CodecBody
from proxy.core.wire.decoder import FrameDecoder
from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient

# What the data plane does with a stream, on both event loops it runs on.
pytestmark = pytest.mark.uvloop_too

COMPLETION_CAPTURES = [
    "llamacpp-completions-sample.txt",
    "llamacpp-completions-sample-with-headers.txt",
    "llamacpp-completions-logprobs.txt",
    "vllm-completions-sample.txt",
    "vllm-completions-token-ids.txt",
    "vllm-completions-stop-sequence.txt",
]
FORMATS = ["msgpack", "protobuf"]


def body(fmt: str = "msgpack", **extra: object) -> dict[str, object]:
    return {"prompt": "The capital of France is", "max_tokens": 32, "stream_format": fmt, **extra}


async def post(
    proxy: ProxyClient, payload: dict[str, object], **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with proxy.post("/v1/completions", json=payload, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize("capture_name", COMPLETION_CAPTURES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("chunk_size", [None, 1, 97])
async def test_codecai_renders_the_upstream_text(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    capture_name: str,
    fmt: str,
    chunk_size: int | None,
) -> None:
    capture = load_capture(capture_name)
    upstream.script = Script(capture, chunk_size=chunk_size)
    status, headers, raw = await post(proxy, body(fmt))
    assert status == 200
    assert headers["Content-Type"] == f"application/x-{fmt}"
    frames = await codecai_frames(raw, fmt)
    assert render(codecai_map(smollm2_tokenizer), frames) == capture.stream_text()
    # The IDs are the model tokenizer's encoding of that text.
    ids = [i for f in frames for i in f.ids]
    assert (
        ids
        == smollm2_tokenizer.tokenizer.encode(capture.stream_text(), add_special_tokens=False).ids
    )


@pytest.mark.parametrize("fmt", FORMATS)
async def test_exactly_one_terminal_frame_last_and_no_empty_frames(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    fmt: str,
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), chunk_size=5)
    _, _, raw = await post(proxy, body(fmt))
    decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
    frames = decoder.feed(raw)
    decoder.flush()  # raises if bytes were left over
    assert [f.done for f in frames] == [False] * (len(frames) - 1) + [True]
    assert all(f.ids for f in frames[:-1])
    assert frames[-1].finish_reason == "length"


@pytest.mark.parametrize(
    ("capture_name", "finish_reason"),
    [
        ("llamacpp-completions-sample.txt", "length"),
        ("vllm-completions-sample.txt", "length"),
        ("vllm-completions-stop-sequence.txt", "stop_sequence"),
    ],
)
async def test_finish_reason_is_mapped_to_the_spec_vocabulary(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    capture_name: str,
    finish_reason: str,
) -> None:
    upstream.script = Script(load_capture(capture_name))
    _, _, raw = await post(proxy, body())
    frames = await codecai_frames(raw, "msgpack")
    assert frames[-1].done
    assert frames[-1].finish_reason == finish_reason


async def test_response_headers(proxy: ProxyClient) -> None:
    # aiohttp's client asks for gzip and br by default; this is about the identity response.
    _, headers, _ = await post(proxy, body("protobuf"), **{"Accept-Encoding": "identity"})
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Cache-Control"] == "no-cache"
    assert headers["X-Accel-Buffering"] == "no"
    assert "Content-Encoding" not in headers


async def test_upstream_gets_a_plain_streaming_request(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    await post(
        proxy, body("msgpack", stream=False, prompt=[1, 2, 3]), **{"Accept-Encoding": "gzip, br"}
    )
    (sent,) = upstream.requests
    forwarded = json.loads(sent.body)
    assert forwarded["stream"] is True  # binary implies streaming
    assert "stream_format" not in forwarded  # ours, never the backend's
    assert forwarded["prompt"] == [1, 2, 3]  # token-ID prompts go up as IDs
    assert sent.headers["Accept-Encoding"] == "identity"  # we parse the SSE, so no compression


async def test_prefixed_msgpack_only_when_accept_names_it(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    status, headers, raw = await post(proxy, body(), Accept="application/codec+msgpack")
    assert status == 200
    assert headers["Content-Type"] == "application/codec+msgpack"
    assert raw[:1] == b"\x00"  # a 4-byte big-endian length, then the map
    frames = FrameDecoder("msgpack").feed(raw)
    ids = [i for f in frames for i in f.ids]
    assert smollm2_tokenizer.tokenizer.decode(ids) == capture.stream_text()
    # ...and the spec framing otherwise, which codecai needs.
    _, headers, raw = await post(proxy, body(), Accept="application/x-msgpack")
    assert headers["Content-Type"] == "application/x-msgpack"
    assert raw[:1] == b"\x82"


# --- upstream faults -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
async def test_upstream_drop_mid_stream_ends_with_error_frame(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    fmt: str,
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, drop_after_events=10)
    status, _, raw = await post(proxy, body(fmt))
    assert status == 200
    frames = await codecai_frames(raw, fmt)
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert tuple(frames[-1].ids) == ()
    assert sum(f.done for f in frames) == 1
    # Nothing received is lost: the text of the first ten events is all there.
    first_ten = "".join(
        json.loads(e.decode()[6:])["choices"][0]["text"] for e in capture.events[:10]
    )
    assert render(codecai_map(smollm2_tokenizer), frames) == first_ten


@pytest.mark.parametrize(
    "inject",
    [
        b"data: {not json\n\n",
        b'data: {"error": {"message": "out of memory", "code": 500}}\n\n',
        b'data: {"choices": [{"text": 42, "index": 0}]}\n\n',
        b"data: [DONE]\n\n",
    ],
    ids=["malformed-json", "error-event", "wrong-type", "early-done"],
)
async def test_bad_upstream_event_ends_with_one_error_frame(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    inject: bytes,
) -> None:
    upstream.script = Script(
        load_capture("llamacpp-completions-sample.txt"), inject_after_events=5, inject=inject
    )
    status, _, raw = await post(proxy, body())
    assert status == 200
    frames = FrameDecoder("msgpack").feed(raw)
    assert frames[-1].done
    assert frames[-1].finish_reason == "error"
    assert sum(f.done for f in frames) == 1


async def test_oversized_upstream_event_ends_with_error_frame(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
) -> None:
    proxy = await make_proxy(max_event_bytes=4096)
    upstream.script = Script(
        load_capture("llamacpp-completions-sample.txt"),
        inject_after_events=3,
        inject=b'data: {"choices": [{"text": "' + b"x" * 10_000 + b'", "index": 0}]}\n\n',
    )
    _, _, raw = await post(proxy, body())
    frames = FrameDecoder("msgpack").feed(raw)
    assert frames[-1].finish_reason == "error"


async def test_slow_upstream_frames_arrive_as_generated(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    # 0.1 s between upstream events: each frame must reach the client long before the end.
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), delay=0.1)
    arrivals: list[float] = []
    started = time.monotonic()
    async with proxy.post("/v1/completions", json=body()) as resp:
        decoder = FrameDecoder("msgpack")
        async for chunk in resp.content.iter_any():
            arrivals += [time.monotonic() - started for _ in decoder.feed(chunk)]
    total = arrivals[-1]
    assert total > 1.0
    assert arrivals[0] < total / 4  # not buffered until the end
    assert len({round(t, 1) for t in arrivals}) > len(arrivals) // 2  # spread out, one by one


async def test_upstream_error_status_before_stream_passes_through(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    capture = load_capture("vllm-completions-error-n2-binary.txt")
    upstream.script = Script(capture)
    status, headers, raw = await post(proxy, body())
    assert status == 400
    assert raw == capture.body
    assert headers["Content-Type"] == "application/json"


async def test_unreachable_upstream_is_a_503_json_error(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9")
    status, headers, raw = await post(proxy, body())
    assert status == 503  # the health check already found nobody listening
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(raw)["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == "no_upstream"
    assert error["message"] == "no upstream is available right now"  # the URL is for the log


async def test_client_disconnect_closes_the_upstream_request(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), delay=0.05)
    async with proxy.post("/v1/completions", json=body()) as resp:
        await resp.content.readany()
        resp.close()  # the client goes away after the first bytes
    # The proxy must hang up on the upstream too, so that the backend stops generating.
    for _ in range(50):
        if upstream.outcomes:
            break
        await asyncio.sleep(0.05)
    assert upstream.outcomes == ["aborted"]


async def test_the_first_frame_is_written_before_the_rest_of_a_large_first_read_is_fed(
    proxy: ProxyClient, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long stream in one upstream write (a fast upstream): the first frame must not wait
    # for the rest of that read to be transcoded.
    capture = load_capture("llamacpp-completions-sample.txt")
    event = b'data: {"choices": [{"text": " x", "index": 0}]}\n\n'
    last = b'data: {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}\n\n'
    long_body = event * 4000 + last + b"data: [DONE]\n\n"
    upstream.script = Script(
        capture.__class__(200, "OK", capture.headers, long_body), chunk_size=len(long_body)
    )
    steps: list[tuple[str, int]] = []
    feed, write = CodecBody.feed, web.StreamResponse.write

    def spy_feed(self: CodecBody, chunk: bytes, now: float) -> bytes:
        steps.append(("feed", len(chunk)))
        return feed(self, chunk, now)

    async def spy_write(self: web.StreamResponse, data: bytes) -> None:
        # The proxy's response starts with its head, written through aiohttp's writer (the
        # fake upstream's writes go through it too: they are not the proxy's).
        if self.headers.get("Codec-Stream-Format"):
            steps.append(("write", len(data)))
        await write(self, data)

    monkeypatch.setattr(CodecBody, "feed", spy_feed)
    monkeypatch.setattr(web.StreamResponse, "write", spy_write)
    status, _, raw = await post(proxy, body())
    assert status == 200
    frames = FrameDecoder("msgpack").feed(raw)
    assert frames[-1].finish_reason == "length"
    assert sum(len(f.ids) for f in frames) == 4000  # " x" is one token
    # The first write came after no more than a few KiB of the stream were fed (a read
    # boundary may split the first slice in two).
    first_write = next(i for i, (step, _) in enumerate(steps) if step == "write")
    assert 0 < sum(size for _, size in steps[:first_write]) <= 2 * 4096
