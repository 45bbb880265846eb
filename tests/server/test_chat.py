"""`POST /v1/chat/completions` with `stream_format`: real llama.cpp and vLLM chat captures, and
the synthetic reasoning and tool-call streams (tests/fixtures/upstream/README.md)."""

from __future__ import annotations

import json

import pytest

from proxy.core.wire.tool_calls import ToolCall
from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.support import frames_of, ids_of, post

PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat(fmt: str = "msgpack", **extra: object) -> dict[str, object]:
    return {"messages": MESSAGES, "max_tokens": 64, "stream_format": fmt, **extra}


def encode(tokenizer: LoadedTokenizer, text: str) -> list[int]:
    ids: list[int] = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    return ids


CHAT_CAPTURES = [
    "llamacpp-chat-sample.txt",
    "llamacpp-chat-usage.txt",
    "llamacpp-chat-emoji-logprobs.txt",
    "vllm-chat.txt",
    "vllm-chat-reasoning-synthetic.txt",
]


@pytest.mark.parametrize("capture_name", CHAT_CAPTURES)
@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
@pytest.mark.parametrize("mode", ["auto", "retokenize"])
async def test_chat_frames_carry_the_generated_text(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    capture_name: str,
    fmt: str,
    mode: str,
) -> None:
    capture = load_capture(capture_name)
    upstream.script = Script(capture, chunk_size=64)
    proxy = await make_proxy(token_ids=mode)
    status, headers, raw = await post(proxy, PATH, json=chat(fmt))
    assert status == 200
    assert headers["Content-Type"] == f"application/x-{fmt}"
    frames = frames_of(raw, fmt)  # type: ignore[arg-type]
    text = capture.stream_text(chat=True)  # reasoning, then content, in stream order
    assert text
    decoded = await codecai_frames(raw, fmt)
    rendered = render(codecai_map(smollm2_tokenizer), decoded)
    if headers["Codec-Token-Source"] == "retokenized":
        assert ids_of(frames) == encode(smollm2_tokenizer, text)
        assert rendered == text
    else:
        # Backend IDs may add tokens that never render (<|im_end|>): the text is a prefix.
        assert rendered.startswith(text)
        assert smollm2_tokenizer.tokenizer.decode(ids_of(frames)) == text


async def test_role_only_and_empty_deltas_make_no_frames(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    # llama.cpp: a role-only first delta, five content deltas, an empty finish delta, a usage
    # chunk; one event per read, so each content delta can make its own frame.
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    _, _, raw = await post(proxy, PATH, json=chat())
    frames = frames_of(raw, "msgpack")
    assert len(frames) <= 6
    assert frames[-1].finish_reason == "length"


async def test_reasoning_comes_before_the_answer(
    make_proxy: MakeProxy, upstream: FakeUpstream, smollm2_tokenizer: LoadedTokenizer
) -> None:
    upstream.script = Script(load_capture("vllm-chat-reasoning-synthetic.txt"))
    proxy = await make_proxy(token_ids="retokenize")
    _, _, raw = await post(proxy, PATH, json=chat())
    text = smollm2_tokenizer.tokenizer.decode(ids_of(frames_of(raw, "msgpack")))
    assert text == "Two plus two is four.\n\nThe answer is 4."


WEATHER = ToolCall("get_weather", '{"city": "Paris"}', "chatcmpl-tool-8d1f")
TIME = ToolCall("get_time", '{"tz": "CET"}', "chatcmpl-tool-93ab")


@pytest.mark.parametrize("fmt", ["msgpack", "msgpack-delta", "protobuf"])
@pytest.mark.parametrize("mode", ["auto", "retokenize"])
@pytest.mark.parametrize("chunk_size", [None, 7])
async def test_tool_calls_ride_on_the_frames_once_complete(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    fmt: str,
    mode: str,
    chunk_size: int | None,
) -> None:
    upstream.script = Script(load_capture("vllm-chat-tool-calls-synthetic.txt"), chunk_size)
    proxy = await make_proxy(token_ids=mode)
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    status, _, raw = await post(proxy, PATH, json=chat(fmt, tools=tools))
    assert status == 200
    frames = frames_of(raw, fmt)  # type: ignore[arg-type]
    calls = [call for frame in frames for call in frame.tool_calls]
    assert calls == [WEATHER, TIME]  # each once, whole, in order
    assert frames[-1].finish_reason == "tool_call"
    assert TIME in frames[-1].tool_calls  # completed by the finish
    text = smollm2_tokenizer.tokenizer.decode(ids_of(frames))
    if mode == "retokenize":
        assert text == "Let me check."  # the markup never was text
    else:
        # The backend's IDs include the tool-call region (I-D: its IDs stay in `ids`).
        assert text.startswith("Let me check.\n<tool_call>\n")
        assert text.count("</tool_call>") == 2


async def test_codecai_reads_tool_call_streams(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    upstream.script = Script(load_capture("vllm-chat-tool-calls-synthetic.txt"))
    for fmt in ("msgpack", "protobuf"):
        _, _, raw = await post(proxy, PATH, json=chat(fmt))
        frames = await codecai_frames(raw, fmt)
        assert frames[-1].done
        assert frames[-1].finish_reason == "tool_call"


async def test_a_call_cut_by_length_is_not_sent(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    capture = load_capture("vllm-chat-tool-calls-synthetic.txt")
    body = capture.body.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"length"')
    upstream.script = Script(type(capture)(capture.status, capture.reason, capture.headers, body))
    _, _, raw = await post(proxy, PATH, json=chat())
    frames = frames_of(raw, "msgpack")
    # get_weather was complete when get_time started; get_time's arguments were cut.
    assert [call for frame in frames for call in frame.tool_calls] == [WEATHER]
    assert frames[-1].finish_reason == "length"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (chat(n=2), "n=1"),
        (chat(stream_format="cbor"), "supported values"),
        ({"stream_format": "msgpack"}, "messages"),
        ({"messages": [], "stream_format": "msgpack"}, "messages"),
        (chat(max_tokens="9"), "max_tokens"),
        (chat(max_completion_tokens=1.5), "max_completion_tokens"),
        (chat(stop=3), "stop"),
    ],
)
async def test_chat_validation(
    proxy: ProxyClient, upstream: FakeUpstream, body: dict[str, object], needle: str
) -> None:
    status, headers, raw = await post(proxy, PATH, json=body)
    assert status == 400
    assert headers["Content-Type"].startswith("application/json")
    assert needle in json.loads(raw)["error"]["message"]
    assert upstream.requests == []


async def test_chat_json_passes_through(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    capture = load_capture("llamacpp-chat-usage.txt")
    upstream.script = Script(capture)
    body = json.dumps({"messages": MESSAGES, "stream": True, "n": 2}).encode()
    status, headers, raw = await post(proxy, PATH, data=body)
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert raw == capture.body
    assert upstream.requests[0].body == body
