"""The OpenAI SDK over `proxy.sdk`'s transports, against the proxy in process in front of a fake
upstream replaying captured streams: what the SDK yields from Codec is what it yields from the
same stream as JSON; what cannot be Codec passes through untouched; refusals fall back to JSON
as docs/ROLLOUT.md says a client should."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Literal

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from proxy.sdk import AsyncCodecTransport, CodecIntegrityError, CodecTransport
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient

MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")
CHAT_CAPTURES = ("llamacpp-chat-emoji-logprobs.txt", "vllm-chat.txt", "llamacpp-chat-usage.txt")
COMPLETION_CAPTURES = (
    "llamacpp-completions-emoji-logprobs.txt",
    "llamacpp-completions-eos-logprobs.txt",
    "vllm-completions-token-ids.txt",
    "vllm-completions-stop-sequence.txt",
)


def base_url(proxy: ProxyClient) -> str:
    return str(proxy.make_url("/v1"))


async def with_sdk(
    proxy: ProxyClient,
    mode: Mode,
    transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None,
    call: Callable[[Any], Any],
) -> Any:
    """`call(client)` with an OpenAI client of `mode` over `transport` (None: httpx's own).

    The sync client runs in a thread: the proxy it talks to runs on this event loop.
    """
    if mode == "sync":
        assert transport is None or isinstance(transport, httpx.BaseTransport)

        def run() -> Any:
            with httpx.Client(transport=transport) as http:
                # openai 3.x types `http_client` as httpx2's client and takes httpx's too
                # (docs/CLIENTS.md).
                client = OpenAI(
                    base_url=base_url(proxy),
                    api_key="none",
                    http_client=http,  # type: ignore[arg-type]
                    max_retries=0,
                )
                return call(client)

        return await asyncio.to_thread(run)
    assert transport is None or isinstance(transport, httpx.AsyncBaseTransport)
    async with httpx.AsyncClient(transport=transport) as http:
        client = AsyncOpenAI(
            base_url=base_url(proxy),
            api_key="none",
            http_client=http,  # type: ignore[arg-type]
            max_retries=0,
        )
        result = call(client)
        return await result if isinstance(result, Awaitable) else result


def codec_transport(mode: Mode, **options: Any) -> CodecTransport | AsyncCodecTransport:
    return CodecTransport(**options) if mode == "sync" else AsyncCodecTransport(**options)


async def collected(stream: Any) -> list[Any]:
    if hasattr(stream, "__aiter__"):
        return [chunk async for chunk in stream]
    return list(stream)


def chat_summary(chunks: Iterable[ChatCompletionChunk]) -> dict[str, Any]:
    """The stream as the SDK's own accumulator adds it up (`client.chat.completions.stream`)."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    usage = None
    for chunk in chunks:
        state.handle_chunk(chunk)
        usage = chunk.usage or usage
    choice = state.current_completion_snapshot.choices[0]
    calls = [
        (call.id, call.function.name, call.function.arguments)
        for call in choice.message.tool_calls or []
    ]
    return {
        "text": choice.message.content or "",
        "calls": calls,
        "finish": choice.finish_reason,
        "usage": usage,
    }


def completion_summary(chunks: Iterable[Completion]) -> dict[str, Any]:
    text, finish, usage = [], None, None
    for chunk in chunks:
        for choice in chunk.choices:
            text.append(choice.text)
            # Typed without None, but the SDK builds streamed chunks unvalidated.
            reason: str | None = choice.finish_reason
            finish = reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return {"text": "".join(text), "finish": finish, "usage": usage}


def chat_call(**extra: Any) -> Callable[[Any], Any]:
    async def call(client: Any) -> dict[str, Any]:
        stream = client.chat.completions.create(
            model="smollm2", messages=MESSAGES, stream=True, max_tokens=64, **extra
        )
        if asyncio.iscoroutine(stream):
            stream = await stream
        return chat_summary(await collected(stream))

    return lambda client: _maybe_sync(client, call)


def completion_call(**extra: Any) -> Callable[[Any], Any]:
    async def call(client: Any) -> dict[str, Any]:
        stream = client.completions.create(
            model="smollm2", prompt="Emoji story:", stream=True, max_tokens=12, **extra
        )
        if asyncio.iscoroutine(stream):
            stream = await stream
        return completion_summary(await collected(stream))

    return lambda client: _maybe_sync(client, call)


def _maybe_sync(client: Any, call: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    # One body for both clients: a sync client's calls return at once, so the coroutine runs
    # to its end without suspending (in the worker thread, on a loop of its own).
    if isinstance(client, OpenAI):
        return asyncio.run(call(client))
    return call(client)


def bodies(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in upstream.requests if request.body]


# --- what the SDK yields --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("token_ids", ["auto", "retokenize"])
@pytest.mark.parametrize("fmt", ["protobuf", "msgpack"])
async def test_tool_calls_as_from_json(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode, token_ids: str, fmt: str
) -> None:
    # The bundled model cannot call tools (tests/fixtures/upstream/README.md): this is the
    # synthetic vLLM stream, replayed; its `token_ids` include the tool-call markup.
    upstream.script = Script(load_capture("vllm-chat-tool-calls-synthetic.txt"), chunk_size=50)
    proxy = await make_proxy(token_ids=token_ids)
    transport = codec_transport(mode, stream_format=fmt)
    codec = await with_sdk(proxy, mode, transport, chat_call(tools=TOOLS))
    plain = await with_sdk(proxy, mode, None, chat_call(tools=TOOLS))
    # The capture was made with `include_usage`, which the replay sends whatever was asked.
    assert {**codec, "usage": None} == {**plain, "usage": None}
    assert codec["text"] == "Let me check."
    assert codec["finish"] == "tool_calls"
    assert codec["calls"] == [
        ("chatcmpl-tool-8d1f", "get_weather", '{"city": "Paris"}'),
        ("chatcmpl-tool-93ab", "get_time", '{"tz": "CET"}'),
    ]
    assert (transport.stats.codec_responses, transport.stats.json_responses) == (1, 0)
    codec_body, json_body = bodies(upstream)
    assert "stream_format" not in codec_body  # the proxy's own upstream request
    assert codec_body["tools"] == json_body["tools"] == TOOLS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CHAT_CAPTURES)
async def test_chat_text_as_from_json(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode, name: str
) -> None:
    upstream.script = Script(load_capture(name), chunk_size=40)
    proxy = await make_proxy()
    transport = codec_transport(mode)
    codec = await with_sdk(proxy, mode, transport, chat_call())
    plain = await with_sdk(proxy, mode, None, chat_call())
    assert codec["text"] == plain["text"] == load_capture(name).stream_text(chat=True)
    assert codec["finish"] == plain["finish"]
    assert transport.stats.codec_wire_bytes < transport.stats.rendered_bytes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", COMPLETION_CAPTURES)
async def test_completion_text_as_from_json(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode, name: str
) -> None:
    upstream.script = Script(load_capture(name), chunk_size=40)
    proxy = await make_proxy()
    transport = codec_transport(mode)
    codec = await with_sdk(proxy, mode, transport, completion_call())
    plain = await with_sdk(proxy, mode, None, completion_call())
    assert codec["text"] == plain["text"] == load_capture(name).stream_text()
    assert codec["finish"] == plain["finish"]


@pytest.mark.parametrize("mode", MODES)
async def test_usage_counts_the_ids(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-usage.txt"))
    proxy = await make_proxy(token_ids="retokenize")
    transport = codec_transport(mode)
    codec = await with_sdk(
        proxy, mode, transport, chat_call(stream_options={"include_usage": True})
    )
    tokens = codec["usage"].completion_tokens
    assert tokens > 0
    assert codec["usage"].prompt_tokens == 0  # not on the wire (docs/CLIENTS.md)
    assert codec["usage"].total_tokens == tokens
    assert transport.stats.codec_tokens == tokens


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("coding", ["identity", "gzip", "br", "zstd"])
async def test_every_coding_the_proxy_sends_decodes(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode, coding: str
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-emoji-logprobs.txt"))
    proxy = await make_proxy()
    transport = codec_transport(mode, accept_encoding=coding)
    codec = await with_sdk(proxy, mode, transport, chat_call())
    assert codec["text"] == load_capture("llamacpp-chat-emoji-logprobs.txt").stream_text(chat=True)
    # dict-zstd: the dictionary was fetched and checked by its hash, once.
    assert bool(transport.assets._dictionaries) == (coding == "zstd")


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_that_fails_raises_in_the_sdk(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, drop_after_events=10)
    proxy = await make_proxy()
    seen: list[str] = []

    async def call(client: Any) -> None:
        stream = client.completions.create(model="m", prompt="Hi", stream=True)
        if asyncio.iscoroutine(stream):
            stream = await stream
        if hasattr(stream, "__aiter__"):
            async for chunk in stream:
                seen.append(chunk.choices[0].text)
        else:
            seen.extend(chunk.choices[0].text for chunk in stream)

    with pytest.raises(openai.APIError, match="finish_reason 'error'"):
        await with_sdk(proxy, mode, codec_transport(mode), lambda c: _maybe_sync(c, call))
    # The text before the failure reached the SDK first, as it would have as JSON.
    first_ten = "".join(
        json.loads(event.decode()[6:])["choices"][0]["text"] for event in capture.events[:10]
    )
    assert "".join(seen) == first_ten


# --- what passes through --------------------------------------------------------------------


NOT_STREAMED = Capture(
    200,
    "OK",
    (("Content-Type", "application/json"),),
    json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "smollm2",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello"},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode(),
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "extra",
    [
        {"stream": False},
        {"n": 2},
        {"logprobs": True, "top_logprobs": 1},
        {"modalities": ["text", "audio"]},
    ],
    ids=["not-streamed", "n", "logprobs", "audio"],
)
async def test_what_cannot_be_codec_passes_through_untouched(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode, extra: dict[str, Any]
) -> None:
    extra = dict(extra)
    stream = extra.pop("stream", True)
    capture = load_capture("llamacpp-chat-sample.txt") if stream else NOT_STREAMED
    upstream.script = Script(capture)
    proxy = await make_proxy()
    transport = codec_transport(mode)

    async def call(client: Any) -> str:
        result = client.chat.completions.create(
            model="smollm2", messages=MESSAGES, stream=stream, **extra
        )
        if asyncio.iscoroutine(result):
            result = await result
        if not stream:
            return str(result.choices[0].message.content)
        return str(chat_summary(await collected(result))["text"])

    text = await with_sdk(proxy, mode, transport, lambda client: _maybe_sync(client, call))
    assert text == ("Hello" if not stream else capture.stream_text(chat=True))
    (body,) = bodies(upstream)
    assert "return_token_ids" not in body  # the proxy saw a JSON request
    assert transport.stats.codec_responses == 0
    assert transport.stats.json_responses == 1
    assert transport.stats.fallbacks == {}


@pytest.mark.parametrize("mode", MODES)
async def test_other_routes_pass_through(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    proxy = await make_proxy()
    transport = codec_transport(mode)
    models = await with_sdk(proxy, mode, transport, lambda client: client.models.list())
    assert models is not None
    assert transport.stats.json_responses == 1


@pytest.mark.parametrize(
    ("method", "path", "content"),
    [
        ("POST", "/v1/chat/completions", {"model": "m", "messages": MESSAGES}),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "stream": True, "n": 3}),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "stream": True, "logprobs": True}),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "stream": True, "audio": {}}),
        ("POST", "/v1/chat/completions", {"stream": True, "stream_format": "msgpack"}),
        ("POST", "/v1/completions", {"prompt": "a", "stream": True, "logprobs": 0}),
        ("POST", "/v1/completions", {"prompt": "a", "stream": True, "echo": True}),
        ("POST", "/v1/completions", {"prompt": ["a", "b"], "stream": True}),
        ("POST", "/v1/completions", {"prompt": "a", "stream": True, "best_of": 2}),
        ("POST", "/v1/completions/codec", {"prompt_ids": [1], "stream": True}),
        ("POST", "/v1/embeddings", {"input": "a", "stream": True}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", b"not json"),
        ("POST", "/v1/completions", b"[1, 2]"),
    ],
)
def test_a_request_that_passes_through_is_sent_byte_for_byte(
    method: str, path: str, content: Any
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"{}", headers={"Content-Encoding": "identity"})

    transport = CodecTransport(httpx.MockTransport(answer))
    raw = content if isinstance(content, bytes) or content is None else json.dumps(content).encode()
    request = httpx.Request(method, f"http://proxy{path}", content=raw, headers={"X-Mine": "1"})
    with httpx.Client(transport=transport) as client:
        response = client.send(request)
        assert response.content == b"{}"
    (forwarded,) = seen
    assert (forwarded.method, forwarded.url, forwarded.content) == (method, request.url, raw or b"")
    assert forwarded.headers == request.headers
    assert (transport.stats.json_responses, transport.stats.json_wire_bytes) == (1, 2)


# --- falling back to JSON -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("mode", MODES)
async def test_a_refused_client_falls_back_and_remembers(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    proxy = await make_proxy(codec_enabled=False)
    clock = Clock()
    transport = codec_transport(mode, clock=clock, remember_seconds=60)
    text = load_capture("llamacpp-chat-sample.txt").stream_text(chat=True)
    for _ in range(2):
        assert (await with_sdk(proxy, mode, transport, chat_call()))["text"] == text
    # The first asked for Codec and got the 403, then JSON; the second went JSON at once.
    assert transport.stats.fallbacks == {"codec_not_enabled": 1}
    assert transport.stats.json_responses == 2
    clock.now += 61
    assert (await with_sdk(proxy, mode, transport, chat_call()))["text"] == text
    assert transport.stats.fallbacks == {"codec_not_enabled": 2}
    assert all("stream_format" not in body for body in bodies(upstream))


class Tampering(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Between the Codec transport and the network: changes what the proxy answered."""

    def __init__(self, change: Callable[[httpx.Request, httpx.Response], httpx.Response]) -> None:
        self._sync = httpx.HTTPTransport()
        self._async = httpx.AsyncHTTPTransport()
        self._change = change

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._sync.handle_request(request)
        response.read()
        return self._change(request, response)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._async.handle_async_request(request)
        await response.aread()
        return self._change(request, response)

    def close(self) -> None:
        self._sync.close()

    async def aclose(self) -> None:
        await self._async.aclose()


def replaced(
    response: httpx.Response, *, content: bytes | None = None, drop: str = ""
) -> httpx.Response:
    headers = [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in (drop, "content-length", "content-encoding", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=response.content if content is None else content,
    )


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_naming_no_map_falls_back_to_json(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    proxy = await make_proxy()

    def no_map(request: httpx.Request, response: httpx.Response) -> httpx.Response:
        return replaced(response, drop="codec-tokenizer-map")

    transport = codec_transport(mode, transport=Tampering(no_map), accept_encoding="identity")
    codec = await with_sdk(proxy, mode, transport, chat_call())
    assert codec["text"] == load_capture("llamacpp-chat-sample.txt").stream_text(chat=True)
    assert transport.stats.fallbacks == {"no_tokenizer_map": 1}
    assert transport.stats.json_responses == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_map_that_is_not_the_named_one_fails_loudly(
    make_proxy: MakeProxy, upstream: FakeUpstream, mode: Mode
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    proxy = await make_proxy()

    def other_map(request: httpx.Request, response: httpx.Response) -> httpx.Response:
        if "/maps/sha256/" in request.url.path:
            return replaced(response, content=response.content.replace(b'"vocab"', b'"vocab" '))
        return replaced(response)

    transport = codec_transport(mode, transport=Tampering(other_map), accept_encoding="identity")
    # This SDK lets the transport's exception through as it is.
    with pytest.raises(CodecIntegrityError, match="hashes to sha256:"):
        await with_sdk(proxy, mode, transport, chat_call())
    assert transport.stats.json_responses == 0


@pytest.mark.parametrize(
    ("status", "body", "headers", "reason", "seconds"),
    [
        (
            426,
            {"error": "codec_version_required", "minimum_version": "0.6"},
            {},
            "codec_version_required",
            300,
        ),
        (
            503,
            {"error": {"code": "verification_mismatch"}},
            {"Retry-After": "42"},
            "verification_mismatch",
            42,
        ),
        (503, {"error": {"code": "tokenizer_mismatch"}}, {}, "tokenizer_mismatch", 300),
    ],
)
def test_refusals_named_in_rollout_fall_back_for_a_while(
    status: int, body: dict[str, Any], headers: dict[str, str], reason: str, seconds: float
) -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        document = json.loads(request.content)
        sent.append(document)
        if "stream_format" in document:
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(
            200, content=b"data: [DONE]\n\n", headers={"Content-Type": "text/event-stream"}
        )

    clock = Clock()
    transport = CodecTransport(httpx.MockTransport(answer), clock=clock)
    request = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.Client(transport=transport) as client:
        for _ in range(2):
            assert client.post("http://proxy/v1/chat/completions", json=request).status_code == 200
        clock.now += seconds + 0.5
        client.post("http://proxy/v1/chat/completions", json=request)
    assert ["stream_format" in document for document in sent] == [True, False, False, True, False]
    assert transport.stats.fallbacks == {reason: 2}


def test_other_errors_are_the_apis_own_answer() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": "model_not_found"}})

    transport = CodecTransport(httpx.MockTransport(answer))
    with httpx.Client(transport=transport) as client:
        response = client.post(
            "http://proxy/v1/completions", json={"model": "x", "prompt": "a", "stream": True}
        )
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "model_not_found"}}
    assert transport.stats.fallbacks == {}
