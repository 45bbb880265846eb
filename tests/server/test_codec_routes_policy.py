"""Every Codec route shares one gate and one guard: the version 426 on Path B and chat, the
safety policy on chat JSON and on tool-call streams."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from proxy.core.wire.tool_calls import ToolCall
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy
from tests.server.policy_support import policy_document, v04, write_policy
from tests.server.support import frames_of, post

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
PATH_B_BODY = msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 8})


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/v1/completions/codec", PATH_B_BODY, "application/x-msgpack"),
        ("/v1/chat/completions", json.dumps({**CHAT, "stream_format": "msgpack"}).encode(), None),
    ],
    ids=["path-b", "chat"],
)
async def test_426_comes_before_any_upstream_contact_on_every_codec_route(
    make_proxy: MakeProxy, upstream: FakeUpstream, path: str, body: bytes, content_type: str | None
) -> None:
    proxy = await make_proxy(version_policy="strict")  # no --model: Path B would list models
    typed = {"Content-Type": content_type or "application/json"}
    old = {**typed, "Codec-Client-Version": "0.2"}
    status, headers, raw = await post(proxy, path, data=body, headers=old)
    assert status == 426, raw
    assert headers["Codec-Min-Version"] == "0.4"
    assert upstream.requests == []
    status, _, _ = await post(proxy, path, data=body, headers={**typed, **v04()})
    assert status == 200
    assert upstream.requests


async def test_chat_json_stream_is_policed(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = load_capture("llamacpp-chat-sample.txt")
    text = capture.stream_text(chat=True)
    assert "glad" in text
    proxy = await make_proxy(safety_policy=write_policy(tmp_path, policy_document("glad")))
    upstream.script = Script(capture, chunk_size=5)
    status, _, raw = await post(proxy, "/v1/chat/completions", json={**CHAT, "stream": True})
    assert status == 200
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert reasons[-1] == "content_filter"
    sent = "".join(
        c["choices"][0].get("delta", {}).get("content") or "" for c in chunks if c["choices"]
    )
    assert "glad" not in sent
    assert text.startswith(sent)


@pytest.mark.parametrize("mode", ["auto", "retokenize"])
@pytest.mark.parametrize("chunk_size", [None, 3])
async def test_tool_calls_survive_the_policy(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path, mode: str, chunk_size: int | None
) -> None:
    # Policed frames are rebuilt: the calls must survive it (the case of a call completing while
    # the policy holds IDs back is tests/core/safety/test_policed_streams.py's).
    proxy = await make_proxy(
        token_ids=mode,
        safety_policy=write_policy(tmp_path, policy_document("Atlantis")),
    )
    upstream.script = Script(load_capture("vllm-chat-tool-calls-synthetic.txt"), chunk_size)
    body = {**CHAT, "stream_format": "msgpack"}
    status, _, raw = await post(proxy, "/v1/chat/completions", json=body, headers=v04())
    assert status == 200
    frames = frames_of(raw, "msgpack")
    assert [call for frame in frames for call in frame.tool_calls] == [
        ToolCall("get_weather", '{"city": "Paris"}', "chatcmpl-tool-8d1f"),
        ToolCall("get_time", '{"tz": "CET"}', "chatcmpl-tool-93ab"),
    ]
    assert all(frame.ids for frame in frames[:-1])
    assert [frame.done for frame in frames].count(True) == 1
    assert frames[-1].finish_reason == "tool_call"
