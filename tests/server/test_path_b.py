"""`POST /v1/completions/codec` (Path B): binary CodecRequest bodies in, the same frames out."""

from __future__ import annotations

import json
import struct

import msgpack
import pytest

from proxy.core.wire import codec_pb2
from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.support import frames_of, ids_of, post

PATH = "/v1/completions/codec"
MSGPACK = {"Content-Type": "application/x-msgpack"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}
PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def protobuf_body(prefix: bool = False, **fields: object) -> bytes:
    body = bytes(codec_pb2.CodecRequest(**fields).SerializeToString())  # type: ignore[arg-type]
    return struct.pack(">I", len(body)) + body if prefix else body


@pytest.mark.parametrize(
    ("headers", "body", "fmt"),
    [
        (MSGPACK, msgpack.packb({"prompt_ids": PROMPT, "max_tokens": 32}), "msgpack"),
        (
            MSGPACK,
            msgpack.packb({"prompt_ids": PROMPT, "stream_format": "protobuf"}),
            "protobuf",
        ),
        (PROTOBUF, protobuf_body(prompt_ids=PROMPT, stream_format="protobuf"), "protobuf"),
        (PROTOBUF, protobuf_body(True, prompt_ids=PROMPT, stream_format="msgpack"), "msgpack"),
        (PROTOBUF, protobuf_body(prompt_ids=PROMPT), "msgpack"),
    ],
    ids=["msgpack", "msgpack-asks-protobuf", "protobuf", "prefixed-protobuf", "default-format"],
)
async def test_path_b_streams_the_same_frames_as_path_a(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    headers: dict[str, str],
    body: bytes,
    fmt: str,
) -> None:
    capture = load_capture("llamacpp-completions-logprobs.txt")
    upstream.script = Script(capture, chunk_size=41)
    status, response_headers, raw = await post(proxy, PATH, data=body, headers=headers)
    assert status == 200
    # The response format follows the body's stream_format, not the request Content-Type.
    assert response_headers["Content-Type"] == f"application/x-{fmt}"
    frames = await codecai_frames(raw, fmt)
    assert render(codecai_map(smollm2_tokenizer), frames) == capture.stream_text()
    path_b_ids = ids_of(frames_of(raw, fmt))  # type: ignore[arg-type]
    # Path A with the same capture and format: identical IDs.
    _, _, path_a = await post(
        proxy, "/v1/completions", json={"prompt": PROMPT, "stream_format": fmt}
    )
    assert ids_of(frames_of(path_a, fmt)) == path_b_ids  # type: ignore[arg-type]


async def test_upstream_gets_a_token_id_prompt_and_the_only_model(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    body = protobuf_body(prompt_ids=PROMPT, max_tokens=7, temperature=0.5, stop=["\n"])
    status, _, _ = await post(proxy, PATH, data=body, headers=PROTOBUF)
    assert status == 200
    models, completion = upstream.requests
    assert (models.method, models.path_qs) == ("GET", "/v1/models")
    assert completion.path_qs == "/v1/completions"
    assert completion.headers["Content-Type"] == "application/json"
    sent = json.loads(completion.body)
    assert sent["prompt"] == PROMPT  # IDs, never detokenized text
    assert sent["model"] == "smollm2"
    assert sent["stream"] is True
    assert (sent["max_tokens"], sent["temperature"], sent["stop"]) == (7, 0.5, ["\n"])
    assert "stream_format" not in sent
    # The model is looked up once, then remembered.
    await post(proxy, PATH, data=body, headers=PROTOBUF)
    assert [r.path_qs for r in upstream.requests].count("/v1/models") == 1


async def test_configured_model_needs_no_lookup(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(model="my-model")
    await post(proxy, PATH, data=msgpack.packb({"prompt_ids": [1]}), headers=MSGPACK)
    (completion,) = upstream.requests
    assert json.loads(completion.body)["model"] == "my-model"
    assert json.loads(completion.body)["max_tokens"] == 256  # the spec is silent: vLLM's


async def test_configured_model_fills_path_a_and_chat_requests_without_one(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(model="my-model")
    messages = [{"role": "user", "content": "hi"}]
    await post(proxy, "/v1/completions", json={"prompt": "x", "stream_format": "msgpack"})
    await post(
        proxy, "/v1/chat/completions", json={"messages": messages, "stream_format": "protobuf"}
    )
    await post(
        proxy,
        "/v1/completions",
        json={"prompt": "x", "model": "theirs", "stream_format": "msgpack"},
    )
    assert [json.loads(r.body)["model"] for r in upstream.requests] == [
        "my-model",
        "my-model",
        "theirs",
    ]


async def test_path_a_without_model_sends_none(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    # Only Path B must name a model; Path A leaves it to the backend, as before.
    await post(proxy, "/v1/completions", json={"prompt": "x", "stream_format": "msgpack"})
    assert [r.path_qs for r in upstream.requests] == ["/v1/completions"]
    assert "model" not in json.loads(upstream.requests[0].body)


@pytest.mark.parametrize("models", [[], ["a", "b"]])
async def test_no_single_upstream_model_is_a_502(
    proxy: ProxyClient, upstream: FakeUpstream, models: list[str]
) -> None:
    upstream.models = models
    status, headers, raw = await post(
        proxy, PATH, data=msgpack.packb({"prompt_ids": [1]}), headers=MSGPACK
    )
    assert status == 502
    assert headers["Content-Type"].startswith("application/json")
    assert "--model" in json.loads(raw)["error"]["message"]
    assert [r.path_qs for r in upstream.requests] == ["/v1/models"]


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"Content-Type": "application/json"}, b'{"prompt_ids": [1]}', 415, None),
        ({}, msgpack.packb({"prompt_ids": [1]}), 415, None),
        (MSGPACK, b"\xc1", 400, "invalid_codec_request"),
        (MSGPACK, msgpack.packb({"prompt_ids": [49152]}), 400, "invalid_token_id"),
        (MSGPACK, msgpack.packb({"prompt_ids": "hi"}), 400, "invalid_type"),
        (PROTOBUF, bytes.fromhex("0a 06 ff ff ff ff ff 01"), 400, "varint_too_long"),
        (PROTOBUF, bytes.fromhex("0a 05 01"), 400, "truncated"),
        (PROTOBUF, bytes.fromhex("00 00 00 09 0a 01 05"), 400, "bad_length_prefix"),
        (PROTOBUF, protobuf_body(prompt_ids=[1], stream_format="json"), 400, None),
        (PROTOBUF, b"", 400, "invalid_prompt"),
    ],
    ids=[
        "json",
        "no-content-type",
        "bad-msgpack",
        "id-outside-vocabulary",
        "wrong-type",
        "long-varint",
        "truncated",
        "bad-prefix",
        "json-format",
        "empty",
    ],
)
async def test_bad_requests_never_reach_the_upstream(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    headers: dict[str, str],
    body: bytes,
    status: int,
    code: str | None,
) -> None:
    got, response_headers, raw = await post(proxy, PATH, data=body, headers=headers)
    assert got == status
    assert response_headers["Content-Type"].startswith("application/json")
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    assert upstream.requests == []


async def test_body_limit_applies(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = await make_proxy(max_body_bytes=64)
    body = msgpack.packb({"prompt_ids": list(range(100))})
    status, _, _ = await post(proxy, PATH, data=body, headers=MSGPACK)
    assert status == 413
    assert upstream.requests == []


@pytest.mark.parametrize("fmt", ["msgpack-delta", "protobuf-delta"])
async def test_delta_formats_on_path_b(
    proxy: ProxyClient, upstream: FakeUpstream, fmt: str
) -> None:
    upstream.script = Script(load_capture("vllm-completions-token-ids.txt"))
    body = msgpack.packb({"prompt_ids": PROMPT, "stream_format": fmt})
    status, headers, raw = await post(proxy, PATH, data=body, headers=MSGPACK)
    assert status == 200
    sent = headers["Codec-Stream-Format"]
    assert sent == ("msgpack-delta" if fmt == "msgpack-delta" else "protobuf")
    assert len(ids_of(frames_of(raw, sent))) == 24  # type: ignore[arg-type]
