"""codec-proxy in front of a Codec server (`upstream_protocol = "codec"`), in process.

The Codec server is a codec-proxy as deployed (the inner one, in front of the fake backend
replaying captured streams), so the frames, codings, maps and refusals are the real ones; where
a case needs the upstream to misbehave (a tampered map, another map named, JSON instead of
frames), `Middle` changes its answers on the way. The clients are plain JSON clients.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionChunk

from proxy.core.maps.discovery import map_path_by_digest
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.maps.publish import publish
from proxy.server import create_app
from proxy.server.control import codec_upstream
from proxy.server.models import upstream_maps
from proxy.server.models.upstream_maps import UpstreamMaps
from proxy.settings import Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import Capture, FakeUpstream, RecordedRequest, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    MakeProxy,
    ProxyClient,
    default_model,
)
from tests.server.test_openai_sdk import NOT_STREAMED, chat_summary

MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
TOOL_CALLS = "vllm-chat-tool-calls-synthetic.txt"
COMPLETION_CAPTURES = (
    "llamacpp-completions-emoji-logprobs.txt",
    "llamacpp-completions-eos-logprobs.txt",
    "vllm-completions-stop-sequence.txt",
)
CHAT_CAPTURES = ("llamacpp-chat-emoji-logprobs.txt", "vllm-chat.txt")
GENERATION = ("/v1/completions", "/v1/chat/completions")
MakeEdge = Callable[..., Awaitable[ProxyClient]]


def url_of(client: ProxyClient | Any) -> str:
    return str(client.make_url("")).rstrip("/")


def is_chat(name: str) -> bool:
    return "chat" in name


def request_for(name: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    if is_chat(name):
        return "/v1/chat/completions", {"model": "smollm2", "messages": MESSAGES, **extra}
    return "/v1/completions", {"model": "smollm2", "prompt": "Emoji story:", **extra}


def read_stream(sse: bytes) -> dict[str, Any]:
    """What an OpenAI client reads from an SSE body."""
    out: dict[str, Any] = {"text": "", "finish": None, "usage": None, "ids": set(), "error": None}
    out["done"] = sse.endswith(b"data: [DONE]\n\n")
    for event in sse.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if not data.startswith(b"{"):
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            out["error"] = chunk["error"]["message"]
            continue
        out["ids"].add(chunk["id"])
        out["usage"] = chunk.get("usage") or out["usage"]
        for choice in chunk["choices"]:
            delta = choice.get("delta")
            out["text"] += (delta.get("content") or "") if delta is not None else choice["text"]
            out["finish"] = choice["finish_reason"] or out["finish"]
    return out


@dataclass
class Middle:
    """Between the edge and the inner proxy: forwards everything, recording it, unless told to
    answer a path itself or to change what passes."""

    target: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    # Answered here instead of forwarded, by path.
    documents: dict[str, Capture] = field(default_factory=dict)
    # Generation answers: the inner's headers replaced (None: removed).
    rewrite: dict[str, str | None] = field(default_factory=dict)
    # The generation request goes on without `stream_format`: an upstream that ignores it.
    strip_stream_format: bool = False
    # The answer to a generation request that asks for Codec (a refusal, frames of its own).
    codec_answer: Capture | None = None

    def app(self) -> web.Application:
        app = web.Application(handler_args={"auto_decompress": False})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        yield
        await self.session.close()

    def generation_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path_qs in GENERATION]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            RecordedRequest(request.method, request.raw_path, dict(request.headers), body)
        )
        own = self.documents.get(request.path)
        if own is not None:
            return web.Response(status=own.status, headers=dict(own.headers), body=own.body)
        generation = request.path in GENERATION
        own = self.codec_answer
        if generation and own is not None and b"stream_format" in body:
            return web.Response(status=own.status, headers=dict(own.headers), body=own.body)
        if generation and self.strip_stream_format and body:
            body = json.dumps(
                {k: v for k, v in json.loads(body).items() if k != "stream_format"}
            ).encode()
        headers = [(k, v) for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length")]  # fmt: skip
        async with self.session.request(
            request.method, self.target + request.raw_path, headers=headers, data=body or None
        ) as answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "date", "server"):
                    response.headers.add(name, value)
            if answer.headers.get("Content-Length") is not None and not generation:
                response.content_length = int(answer.headers["Content-Length"])
            if generation:
                for name, replaced in self.rewrite.items():
                    response.headers.popall(name, None)
                    if replaced is not None:
                        response.headers[name] = replaced
            await response.prepare(request)
            async for part in answer.content.iter_any():
                await response.write(part)
            await response.write_eof()
            return response


@pytest.fixture
def make_edge(aiohttp_client: AiohttpClient) -> MakeEdge:
    """An edge proxy (`upstream_protocol = "codec"`) in front of `upstream`."""

    async def make(upstream: str, **changes: Any) -> ProxyClient:
        settings = pinned_draws.settings(upstream=(upstream,), upstream_protocol="codec", **changes)
        return await aiohttp_client(create_app(settings))

    return make


@pytest.fixture
async def edge(proxy: ProxyClient, make_edge: MakeEdge) -> ProxyClient:
    return await make_edge(url_of(proxy))


@pytest.fixture
async def middle(proxy: ProxyClient, aiohttp_server: AiohttpServer) -> Middle:
    between = Middle(url_of(proxy))
    server = await aiohttp_server(between.app())
    between.target = url_of(proxy)
    between.url = url_of(server)  # type: ignore[attr-defined]
    return between


def maps_of(edge: ProxyClient) -> UpstreamMaps:
    maps = default_model(edge).upstream_maps
    assert maps is not None
    return maps


async def metric(client: ProxyClient, name: str, **labels: str) -> float:
    async with client.get("/metrics") as resp:
        text = await resp.text()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1 : line.index("}")].split(",")))
            if got == wanted:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def post(client: ProxyClient, path: str, body: Any, **kwargs: Any) -> tuple[int, Any, bytes]:
    async with client.post(path, json=body, **kwargs) as resp:
        return resp.status, resp.headers, await resp.read()


async def ready(client: ProxyClient) -> tuple[int, dict[str, Any]]:
    async with client.get("/readyz") as resp:
        return resp.status, await resp.json()


def upstream_map_check(report: dict[str, Any]) -> dict[str, Any]:
    return dict(report["checks"]["upstream_map"])


def offer(monkeypatch: pytest.MonkeyPatch, coding: str) -> None:
    """The edge offers only `coding` (what the inner picks among codings is its own)."""
    monkeypatch.setattr(codec_upstream, "codec_accept_encoding", lambda *, zstd: coding)


# --- rendered as the client asked -----------------------------------------------------------


@pytest.mark.parametrize("name", COMPLETION_CAPTURES + CHAT_CAPTURES)
@pytest.mark.parametrize("coding", ["identity", "gzip", "br", "zstd"])
async def test_streams_render_as_the_upstreams_json(
    proxy: ProxyClient,
    edge: ProxyClient,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    coding: str,
) -> None:
    capture = load_capture(name)
    upstream.script = Script(capture, chunk_size=40)
    offer(monkeypatch, coding)
    path, body = request_for(name, stream=True, max_tokens=64)
    status, headers, raw = await post(edge, path, body, headers={"X-Request-Id": "req-7"})
    assert status == 200
    read = read_stream(raw)
    assert read["text"] == capture.stream_text(chat=is_chat(name))
    assert read["finish"] in ("stop", "length")
    assert read["error"] is None
    assert read["done"]
    prefix = "chatcmpl" if is_chat(name) else "cmpl"
    assert read["ids"] == {f"{prefix}-req-7"}
    assert read["usage"] is None  # not asked for
    assert headers["Content-Type"] == "text/event-stream"
    assert headers["X-Request-Id"] == "req-7"
    assert not [h for h in headers if h.lower().startswith("codec-")]
    assert "Content-Encoding" not in headers
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="rendered") == 1  # fmt: skip
    # The upstream (the inner proxy) answered frames in the coding offered, dictionary zstd
    # included (the edge fetched the dictionary the answer named, checked by its hash).
    assert await metric(proxy, "codec_proxy_codec_requests_total", model="default",
                        format="protobuf", client_version="0.5", encoding=coding) == 1  # fmt: skip
    wire = await metric(edge, "codec_proxy_upstream_bytes_total", mode="rendered", model="default")
    assert 0 < wire < len(capture.body) / 4


@pytest.mark.parametrize("fmt", ["protobuf", "msgpack"])
async def test_the_frame_format_asked_is_the_settings(
    proxy: ProxyClient, make_edge: MakeEdge, upstream: FakeUpstream, fmt: str
) -> None:
    capture = load_capture("llamacpp-chat-emoji-logprobs.txt")
    upstream.script = Script(capture)
    edge = await make_edge(url_of(proxy), upstream_stream_format=fmt)
    path, body = request_for("chat", stream=True)
    status, _, raw = await post(edge, path, body)
    assert status == 200
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    tokens = await metric(edge, "codec_proxy_rendered_tokens_total", model="default", format=fmt)
    assert tokens > 0


@pytest.mark.parametrize("name", [COMPLETION_CAPTURES[0], CHAT_CAPTURES[1]])
async def test_a_request_not_streamed_gets_the_whole_answer(
    edge: ProxyClient, upstream: FakeUpstream, name: str
) -> None:
    capture = load_capture(name)
    upstream.script = Script(capture, chunk_size=40)
    path, body = request_for(name, max_tokens=64)
    status, headers, raw = await post(edge, path, body)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(raw)
    answer = json.loads(raw)
    choice = answer["choices"][0]
    text = choice["message"]["content"] if is_chat(name) else choice["text"]
    assert text == capture.stream_text(chat=is_chat(name))
    assert answer["object"] == ("chat.completion" if is_chat(name) else "text_completion")
    assert answer["usage"]["completion_tokens"] > 0
    # Asked of the backend as a stream: frames are one.
    assert json.loads(upstream.requests[-1].body)["stream"] is True


async def test_a_whole_answer_whose_stream_failed_is_a_502(
    edge: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), drop_after_events=5)
    status, _, raw = await post(edge, *request_for("completions"))
    assert status == 502
    assert json.loads(raw)["error"]["code"] == "codec_stream_error"


async def test_a_stream_that_fails_after_it_started_ends_with_the_error_event(
    edge: ProxyClient, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, drop_after_events=10)
    status, _, raw = await post(edge, *request_for("completions", stream=True))
    assert status == 200
    read = read_stream(raw)
    assert read["error"] is not None
    assert read["done"]
    first_ten = "".join(
        json.loads(event.decode()[6:])["choices"][0]["text"] for event in capture.events[:10]
    )
    assert read["text"] == first_ten


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_are_rendered(
    edge: ProxyClient, upstream: FakeUpstream, stream: bool
) -> None:
    upstream.script = Script(load_capture(TOOL_CALLS), chunk_size=50)
    body = {"model": "smollm2", "messages": MESSAGES, "tools": TOOLS, "stream": stream}
    status, _, raw = await post(edge, "/v1/chat/completions", body)
    assert status == 200
    expected = [
        ("chatcmpl-tool-8d1f", "get_weather", '{"city": "Paris"}'),
        ("chatcmpl-tool-93ab", "get_time", '{"tz": "CET"}'),
    ]
    if stream:
        chunks = [
            ChatCompletionChunk.model_validate_json(event[6:])
            for event in raw.split(b"\n\n")
            if event.startswith(b"data: {")
        ]
        summary = chat_summary(chunks)
        assert (summary["text"], summary["finish"]) == ("Let me check.", "tool_calls")
        assert summary["calls"] == expected
        return
    message = json.loads(raw)["choices"][0]["message"]
    assert message["content"] == "Let me check."
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"])
             for c in message["tool_calls"]]  # fmt: skip
    assert calls == expected


async def test_usage_when_the_client_asked_for_it(
    edge: ProxyClient, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-chat-usage.txt")
    upstream.script = Script(capture)
    path, body = request_for("chat", stream=True, stream_options={"include_usage": True})
    _, _, raw = await post(edge, path, body)
    usage = read_stream(raw)["usage"]
    tokens = await metric(edge, "codec_proxy_rendered_tokens_total", model="default",
                          format="protobuf")  # fmt: skip
    assert usage == {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
    assert tokens > 0
    # The backend was asked for its usage chunk as the client asked (the inner proxy's
    # business); the client's request reached it with stream_options.
    assert json.loads(upstream.requests[-1].body)["stream_options"] == {"include_usage": True}


async def test_the_openai_sdk_reads_the_rendered_stream(
    edge: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture(TOOL_CALLS), chunk_size=30)
    async with AsyncOpenAI(base_url=f"{url_of(edge)}/v1", api_key="none", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model="smollm2", messages=MESSAGES, tools=TOOLS, stream=True
        )
        summary = chat_summary([chunk async for chunk in stream])
        whole = await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, tools=TOOLS)
    assert summary["calls"][0][1:] == ("get_weather", '{"city": "Paris"}')
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.tool_calls is not None
    assert [
        c.function.name for c in whole.choices[0].message.tool_calls if c.type == "function"
    ] == [
        "get_weather",
        "get_time",
    ]


# --- what the edge asks, and what it pins -----------------------------------------------------


async def test_the_upstream_is_asked_for_frames_with_what_the_edge_decodes(
    proxy: ProxyClient, middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    maps = maps_of(edge)
    published = default_model(proxy).published
    assert maps.pinned == published.digest  # from the upstream's index, before any request
    status, report = await ready(edge)
    assert status == 200
    assert upstream_map_check(report) == {"ready": True, "reason": "upstream_map_pinned"}
    # The dictionary the map lists for protobuf is fetched ahead: only then is zstd offered.
    for _ in range(100):
        if maps.zstd_dictionary() is not None:
            break
        await asyncio.sleep(0.01)
    assert maps.zstd_dictionary() is not None
    fetched = [r.path_qs for r in middle.requests if r.path_qs.startswith("/.well-known/")]
    assert fetched[:2] == ["/.well-known/codec/index.json", map_path_by_digest(published.digest)]
    assert fetched[2].startswith("/.well-known/codec/dicts/")
    body = {"model": "smollm2", "messages": MESSAGES, "stream": True, "temperature": 0}
    await post(edge, "/v1/chat/completions", body, headers={"Accept-Encoding": "gzip"})
    asked = middle.generation_requests()[-1]
    assert json.loads(asked.body) == {**body, "stream_format": "protobuf"}
    assert asked.headers["Codec-Client-Version"] == "0.5"
    assert asked.headers["Accept-Encoding"] == "zstd, br, gzip"
    assert asked.headers["Accept"] == "application/x-protobuf"
    # The map was fetched once: the answer named the pinned one.
    assert [r.path_qs for r in middle.requests].count(map_path_by_digest(published.digest)) == 1


async def test_a_model_left_uncompressed_asks_the_long_hop_for_identity_too(
    middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-chat-sample.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url, uncompressed=True)  # type: ignore[attr-defined]
    path, body = request_for("chat", stream=True)
    _, _, raw = await post(edge, path, body, headers={"Accept-Encoding": "gzip"})
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    asked = middle.generation_requests()[-1]
    assert asked.headers["Accept-Encoding"] == "identity"
    assert "stream_format" in json.loads(asked.body)  # still Codec, only not compressed


async def test_an_upstream_without_an_index_is_pinned_from_its_first_answer(
    middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    middle.documents["/.well-known/codec/index.json"] = Capture(404, "Not Found", (), b"{}")
    capture = load_capture("llamacpp-chat-sample.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    status, report = await ready(edge)
    assert status == 200
    assert upstream_map_check(report)["reason"] == "upstream_map_on_first_answer"
    _, _, raw = await post(edge, *request_for("chat", stream=True))
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    assert maps_of(edge).pinned is not None
    assert upstream_map_check((await ready(edge))[1])["reason"] == "upstream_map_pinned"


async def test_a_map_that_cannot_be_fetched_at_start_is_fetched_again(
    proxy: ProxyClient,
    middle: Middle,
    make_edge: MakeEdge,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_maps, "RETRY_SECONDS", 0.05)
    path = map_path_by_digest(default_model(proxy).published.digest)
    middle.documents[path] = Capture(503, "Unavailable", (), b"{}")
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    status, report = await ready(edge)
    assert status == 503
    assert upstream_map_check(report) == {"ready": False, "reason": "upstream_map_pending"}
    assert await metric(edge, "codec_proxy_upstream_maps_total", model="default",
                        event="unavailable") >= 1  # fmt: skip
    del middle.documents[path]
    for _ in range(100):
        if maps_of(edge).pinned is not None:
            break
        await asyncio.sleep(0.02)
    status, report = await ready(edge)
    assert status == 200
    assert upstream_map_check(report)["reason"] == "upstream_map_pinned"


async def test_a_tampered_map_is_never_rendered_with(
    proxy: ProxyClient, middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    published = default_model(proxy).published
    # Same length, one token's text changed: a decoder built from it would render other text.
    tampered = published.body.replace(b'"Paris"', b'"Pxris"', 1)
    if tampered == published.body:
        tampered = published.body.replace(b'"the"', b'"thx"', 1)
    assert tampered != published.body
    middle.documents[map_path_by_digest(published.digest)] = Capture(200, "OK", (), tampered)
    capture = load_capture("llamacpp-chat-sample.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    status, report = await ready(edge)
    assert status == 503
    assert upstream_map_check(report) == {"ready": False, "reason": "upstream_map_mismatch"}
    hash_mismatches = await metric(edge, "codec_proxy_upstream_maps_total", model="default",
                                   event="hash_mismatch")  # fmt: skip
    assert hash_mismatches == 1
    # The client still gets the right text: its request went as JSON.
    _, headers, raw = await post(edge, *request_for("chat", stream=True))
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    assert headers["Content-Type"].startswith("text/event-stream")
    asked = [json.loads(r.body) for r in middle.generation_requests()]
    assert ["stream_format" in b for b in asked] == [False]  # not even asked: bad a moment ago
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="skipped") == 1  # fmt: skip
    assert maps_of(edge).pinned is None


async def test_an_answer_that_names_a_tampered_map_goes_again_as_json(
    proxy: ProxyClient, middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-emoji-logprobs.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    other = "e" * 64
    middle.documents[map_path_by_digest(other)] = Capture(
        200, "OK", (), default_model(proxy).published.body
    )
    middle.rewrite["Codec-Tokenizer-Map"] = f"smollm2 sha256:{other}"
    _, _, raw = await post(edge, *request_for("completions", stream=True))
    assert read_stream(raw)["text"] == capture.stream_text()
    asked = [json.loads(r.body) for r in middle.generation_requests()]
    assert ["stream_format" in b for b in asked] == [True, False]
    assert asked[1] == {"model": "smollm2", "prompt": "Emoji story:", "stream": True}
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="map_mismatch") == 1  # fmt: skip
    assert (await ready(edge))[0] == 503


async def test_an_answer_naming_another_map_is_rendered_with_that_map_once_verified(
    proxy: ProxyClient,
    middle: Middle,
    make_edge: MakeEdge,
    upstream: FakeUpstream,
    smollm2_vocabulary: Vocabulary,
) -> None:
    first = default_model(proxy).published
    # The same vocabulary under another id: other bytes, another digest (a redeployed model).
    other: PublishedMap = publish(
        smollm2_vocabulary.loaded, "other/smollm2", content=smollm2_vocabulary.map_content
    )
    assert other.digest != first.digest
    middle.documents[map_path_by_digest(other.digest)] = Capture(200, "OK", (), other.body)
    capture = load_capture("vllm-chat.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    maps = maps_of(edge)
    assert maps.pinned == first.digest
    middle.rewrite["Codec-Tokenizer-Map"] = other.header_value
    for _ in range(2):
        _, _, raw = await post(edge, *request_for("chat", stream=True))
        assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    assert maps.pinned == other.digest
    assert await metric(edge, "codec_proxy_upstream_maps_total", model="default",
                        event="drift") == 1  # fmt: skip
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="rendered") == 2  # fmt: skip
    assert (await ready(edge))[0] == 200
    # Both maps are served here by digest, for this proxy's own Codec clients.
    for published in (first, other):
        async with edge.get(map_path_by_digest(published.digest)) as resp:
            assert resp.status == 200
            assert await resp.read() == published.body


async def test_an_answer_naming_no_map_goes_again_as_json(
    middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-chat-sample.txt")
    upstream.script = Script(capture)
    middle.rewrite["Codec-Tokenizer-Map"] = None
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    _, _, raw = await post(edge, *request_for("chat", stream=True))
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    assert len(middle.generation_requests()) == 2
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="map_unavailable") == 1  # fmt: skip


@pytest.mark.parametrize("stream", [True, False])
async def test_ids_past_the_map_end_the_answer_and_the_map_is_fetched_again(
    proxy: ProxyClient, middle: Middle, make_edge: MakeEdge, stream: bool
) -> None:
    published = default_model(proxy).published
    size = json.loads(published.body)["vocab_size"]
    hello = MapDecoder.from_map(published.body).table.index(b"Hello")
    # The frame before is rendered; the one with an ID past the map ends the answer.
    frames = (Frame((hello,)), Frame((hello, size)), Frame((), True, "length"))
    middle.codec_answer = Capture(
        200,
        "OK",
        (("Content-Type", "application/x-protobuf"),
         ("Codec-Tokenizer-Map", published.header_value)),
        b"".join(encoder_for("protobuf").encode(frame) for frame in frames),
    )  # fmt: skip
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    map_path = map_path_by_digest(published.digest)
    assert [r.path_qs for r in middle.requests].count(map_path) == 1  # pinned at start
    status, _, raw = await post(edge, *request_for("chat", stream=stream))
    named = f"token ID {size} is past the {size} IDs of map {published.header_value}"
    if stream:
        assert status == 200
        read = read_stream(raw)
        assert named in read["error"]
        assert read["text"] == "Hello"
        assert read["finish"] is None
        assert read["done"]
    else:
        assert status == 502
        assert named in json.loads(raw)["error"]["message"]
    assert await metric(edge, "codec_proxy_upstream_maps_total", model="default",
                        event="drift") == 1  # fmt: skip
    # Forgotten, and fetched again at once: an answer naming it meanwhile waits for that.
    for _ in range(200):
        if maps_of(edge).decoder(published.digest) is not None:
            break
        await asyncio.sleep(0.02)
    assert maps_of(edge).decoder(published.digest) is not None
    assert [r.path_qs for r in middle.requests].count(map_path) == 2


# --- an upstream that answers JSON, or refuses Codec ----------------------------------------


async def test_an_upstream_that_answers_json_is_relayed_and_not_asked_again(
    middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    middle.strip_stream_format = True
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    for _ in range(2):
        status, _, raw = await post(edge, *request_for("completions", stream=True))
        assert status == 200
        assert raw == capture.body  # the upstream's JSON, as it sent it
    asked = [json.loads(r.body) for r in middle.generation_requests()]
    assert ["stream_format" in b for b in asked] == [True, False]
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="answered_json") == 1  # fmt: skip
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="skipped") == 1  # fmt: skip


async def test_a_whole_answer_from_an_upstream_that_answers_json_is_asked_again(
    middle: Middle, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    upstream.script = Script(NOT_STREAMED)
    middle.strip_stream_format = True
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    path, body = request_for("chat")
    status, _, raw = await post(edge, path, body)
    assert status == 200
    assert raw == NOT_STREAMED.body
    repeated = middle.generation_requests()[-1]
    assert json.loads(repeated.body) == body  # as the client sent it


@pytest.mark.parametrize(
    ("status", "error", "retry_after"),
    [
        (403, {"error": {"code": "codec_not_enabled", "message": "no"}}, None),
        (426, {"error": "codec_version_required", "minimum_version": "0.6"}, None),
        (503, {"error": {"code": "tokenizer_mismatch", "message": "drift"}}, "5"),
    ],
)
async def test_a_refusal_of_codec_is_asked_again_as_json(
    middle: Middle,
    make_edge: MakeEdge,
    upstream: FakeUpstream,
    status: int,
    error: dict[str, Any],
    retry_after: str | None,
) -> None:
    capture = load_capture("llamacpp-chat-sample.txt")
    upstream.script = Script(capture)
    edge = await make_edge(middle.url)  # type: ignore[attr-defined]
    refusal = json.dumps(error).encode()
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    if retry_after is not None:
        headers += (("Retry-After", retry_after),)
    middle.codec_answer = Capture(status, "Refused", headers, refusal)
    path, body = request_for("chat", stream=True)
    status_, _, raw = await post(edge, path, body)
    assert status_ == 200
    assert read_stream(raw)["text"] == capture.stream_text(chat=True)
    asked = [json.loads(r.body) for r in middle.generation_requests()]
    assert asked == [{**body, "stream_format": "protobuf"}, body]
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="refused") == 1  # fmt: skip
    # Remembered: the next request is not asked as Codec.
    await post(edge, path, body)
    assert "stream_format" not in json.loads(middle.generation_requests()[-1].body)


async def test_the_inner_proxys_own_rollout_refusal_is_followed(
    make_proxy: MakeProxy, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    inner = await make_proxy(codec_enabled=False)
    edge = await make_edge(url_of(inner))
    status, _, raw = await post(edge, *request_for("completions", stream=True))
    assert status == 200
    assert raw == capture.body
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="refused") == 1  # fmt: skip
    assert await metric(inner, "codec_proxy_codec_refused_total", model="default",
                        reason="codec_not_enabled") == 1  # fmt: skip


@pytest.mark.parametrize("name", ["llamacpp-error-bad-json.txt", "llamacpp-error-tools-500.txt"])
async def test_an_upstream_error_before_the_stream_is_relayed(
    edge: ProxyClient, upstream: FakeUpstream, name: str
) -> None:
    capture = load_capture(name)
    upstream.script = Script(capture)
    status, headers, raw = await post(edge, *request_for("chat", stream=True))
    assert status == capture.status
    assert raw == capture.body
    assert not [h for h in headers if h.lower().startswith("codec-")]
    assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                        result="upstream_error") == 1  # fmt: skip


# --- what is relayed as it is ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/chat/completions", {"stream": True, "n": 2}),
        ("/v1/chat/completions", {"stream": True, "logprobs": True, "top_logprobs": 2}),
        ("/v1/completions", {"stream": True, "echo": True}),
        ("/v1/completions", {"stream": True, "prompt": ["a", "b"]}),
        ("/v1/completions", {"stream": True, "stream_format": "json"}),
        ("/v1/embeddings", {"input": "hello"}),
    ],
)
async def test_what_frames_cannot_carry_is_relayed_as_sent(
    edge: ProxyClient, upstream: FakeUpstream, path: str, extra: dict[str, Any]
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    body = {"model": "smollm2", "prompt": "Hi", "messages": MESSAGES, **extra}
    sent = json.dumps(body, separators=(", ", ": ")).encode()
    async with edge.post(path, data=sent, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        assert await resp.read() == capture.body
    # Byte for byte through both proxies to the backend.
    assert upstream.requests[-1].body == sent
    if path in GENERATION:
        assert await metric(edge, "codec_proxy_codec_upstream_requests_total", model="default",
                            result="relayed") == 1  # fmt: skip


async def test_a_codec_clients_own_request_goes_up_as_it_is(
    proxy: ProxyClient, edge: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"))
    body = {"model": "smollm2", "prompt": "Hi", "stream": True, "stream_format": "msgpack"}
    headers = {"Accept-Encoding": "gzip", "Codec-Client-Version": "0.5"}
    status, got, raw = await post(edge, "/v1/completions", body, headers=headers)
    assert status == 200
    assert got["Content-Type"] == "application/x-msgpack"
    assert got["Content-Encoding"] == "gzip"
    assert raw  # the inner proxy's frames
    named = got["Codec-Tokenizer-Map"]
    published = default_model(proxy).published
    assert named == published.header_value
    # The map it names is served here too, as verified: a Codec client fetches it from us.
    async with edge.get(map_path_by_digest(published.digest)) as resp:
        assert resp.status == 200
        assert await resp.read() == published.body


async def test_the_edges_own_rollout_switches_refuse_codec_clients_not_json_ones(
    proxy: ProxyClient, make_edge: MakeEdge, upstream: FakeUpstream
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    edge = await make_edge(url_of(proxy), codec_enabled=False)
    body = {"model": "smollm2", "prompt": "Hi", "stream": True}
    status, _, raw = await post(edge, "/v1/completions", {**body, "stream_format": "protobuf"})
    assert status == 403
    assert json.loads(raw)["error"]["code"] == "codec_not_enabled"
    status, _, raw = await post(edge, "/v1/completions", body)
    assert status == 200
    assert read_stream(raw)["text"] == capture.stream_text()  # rendered from frames all the same


async def test_path_b_goes_up_as_it_is(edge: ProxyClient, upstream: FakeUpstream) -> None:
    import msgpack

    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"))
    request = msgpack.packb({"prompt_ids": [1, 2, 3], "max_tokens": 4, "stream_format": "msgpack"})
    async with edge.post(
        "/v1/completions/codec",
        data=request,
        headers={"Content-Type": "application/x-msgpack", "Codec-Model": "default"},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/x-msgpack"
        assert await resp.read()
    assert json.loads(upstream.requests[-1].body)["prompt"] == [1, 2, 3]


# --- a client that leaves --------------------------------------------------------------------


async def test_a_client_that_leaves_mid_stream_closes_the_chain(
    edge: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"), delay=0.05)
    path, body = request_for("completions", stream=True)
    async with edge.post(path, json=body) as resp:
        assert resp.status == 200
        assert await resp.content.readany()  # the first chunk is out
        resp.close()  # and the client is gone
    # The edge closes its upstream, the inner proxy its own: the backend sees the abort while it
    # still has events to send.
    for _ in range(100):
        if upstream.outcomes:
            break
        await asyncio.sleep(0.05)
    assert upstream.outcomes == ["aborted"]
    assert await metric(edge, "codec_proxy_streams_total", model="default", mode="rendered",
                        end="client_disconnect") == 1  # fmt: skip


# --- settings -------------------------------------------------------------------------------


def test_a_codec_upstream_needs_no_tokenizer_and_takes_none() -> None:
    settings = Settings(upstream=("http://a",), upstream_protocol="codec")
    (model,) = settings.model_list()
    assert (model.tokenizer, model.upstream_protocol) == (None, "codec")
    with pytest.raises(ValueError, match="'tokenizer' is not used with upstream_protocol"):
        replace(settings, tokenizer=Path("/models/x.gguf"))
    with pytest.raises(ValueError, match="'tokenizer' is required"):
        replace(settings, upstream_protocol="json")
    with pytest.raises(ValueError, match="'safety_policy' cannot police"):
        replace(settings, safety_policy=Path("/etc/policy.toml"))
