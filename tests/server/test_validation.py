"""Requests a Codec stream cannot carry get a 400 with an OpenAI-style error body, and the
upstream is never contacted (codec-spec.md §12 items 10-13)."""

from __future__ import annotations

import json

import pytest

from tests.fake_upstream import FakeUpstream
from tests.server.conftest import MakeProxy, ProxyClient

BAD_REQUESTS: list[tuple[str, object, str]] = [
    ("unknown-format", {"prompt": "x", "stream_format": "cbor"}, "msgpack"),
    ("format-not-string", {"prompt": "x", "stream_format": 3}, "stream_format"),
    ("n2", {"prompt": "x", "stream_format": "msgpack", "n": 2}, "n=1"),
    ("best-of-2", {"prompt": "x", "stream_format": "protobuf", "best_of": 2}, "best_of=1"),
    ("batch-of-strings", {"prompt": ["a", "b"], "stream_format": "msgpack"}, "batch"),
    ("batch-of-ids", {"prompt": [[1, 2], [3]], "stream_format": "msgpack"}, "batch"),
    ("id-too-big", {"prompt": [1, 49152], "stream_format": "msgpack"}, "outside the vocabulary"),
    ("id-negative", {"prompt": [-1], "stream_format": "msgpack"}, "outside the vocabulary"),
    ("id-float", {"prompt": [1.5], "stream_format": "msgpack"}, "integers"),
    ("id-bool", {"prompt": [True], "stream_format": "msgpack"}, "integers"),
    ("empty-ids", {"prompt": [], "stream_format": "msgpack"}, "prompt"),
    ("prompt-number", {"prompt": 5, "stream_format": "msgpack"}, "prompt"),
    ("n-string", {"prompt": "x", "stream_format": "msgpack", "n": "2"}, "n must be"),
    (
        "max-tokens-string",
        {"prompt": "x", "stream_format": "msgpack", "max_tokens": "9"},
        "max_tokens",
    ),
    ("stop-number", {"prompt": "x", "stream_format": "msgpack", "stop": 7}, "stop"),
    ("echo", {"prompt": "x", "stream_format": "msgpack", "echo": True}, "echo"),
    ("not-an-object", ["prompt"], "JSON object"),
]


@pytest.mark.parametrize(
    ("case", "payload", "needle"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS]
)
async def test_rejected_before_the_upstream(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    case: str,
    payload: object,
    needle: str,
) -> None:
    async with proxy.post("/v1/completions", data=json.dumps(payload)) as resp:
        assert resp.status == 400, case
        assert resp.headers["Content-Type"].startswith("application/json")
        error = (await resp.json())["error"]
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"
    assert upstream.requests == []


async def test_unknown_format_lists_the_supported_ones(proxy: ProxyClient) -> None:
    async with proxy.post("/v1/completions", json={"prompt": "x", "stream_format": "xml"}) as resp:
        message = (await resp.json())["error"]["message"]
    for supported in ("json", "msgpack", "protobuf"):
        assert supported in message


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b'{"prompt": "x",}'])
async def test_malformed_json_is_400(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    raw: bytes,
) -> None:
    async with proxy.post("/v1/completions", data=raw) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_json"
    assert upstream.requests == []


async def test_body_over_the_limit_is_413(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = await make_proxy(max_body_bytes=1024)
    payload = {"prompt": "x" * 4096, "stream_format": "msgpack"}
    async with proxy.post("/v1/completions", json=payload) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "body_too_large"
    assert upstream.requests == []


async def test_a_batch_of_one_is_one_prompt(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    async with proxy.post(
        "/v1/completions", json={"prompt": [[1, 2]], "stream_format": "msgpack"}
    ) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(upstream.requests) == 1


async def test_json_requests_are_not_validated_beyond_routing(
    proxy: ProxyClient,
    upstream: FakeUpstream,
) -> None:
    # n=2 is the backend's business when the client wants JSON.
    async with proxy.post("/v1/completions", json={"prompt": "x", "n": 2, "stream": True}) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(upstream.requests) == 1


def nested_codec_request(depth: int) -> bytes:
    """A Codec request either route takes, with one field nested `depth` levels deep."""
    fields = b'{"prompt": "x", "messages": [{"role": "user", "content": "x"}], '
    return fields + b'"stream_format": "msgpack", "a": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "raw",
    [
        # RFC 8259 §8.2: a lone surrogate cannot be written again as UTF-8 for the backend.
        b'{"prompt": "\\ud800", "stream_format": "msgpack"}',
        b'{"messages": [{"role": "user", "content": "\\udc00"}], "stream_format": "msgpack"}',
        b'{"prompt": "x", "stream_format": "json", "user": "a\\ud800"}',
        nested_codec_request(1025),  # past orjson's parse depth
        nested_codec_request(100_000),  # where the `json` module overflowed the stack
        nested_codec_request(300),  # parsed, but deeper than orjson writes upstream
    ],
    ids=["surrogate-prompt", "surrogate-message", "surrogate-json", "1025", "100000", "300"],
)
async def test_json_the_backend_must_not_get_is_400_invalid_json(
    proxy: ProxyClient, upstream: FakeUpstream, path: str, raw: bytes
) -> None:
    async with proxy.post(path, data=raw) as resp:
        assert resp.status == 400
        assert resp.headers["Content-Type"].startswith("application/json")
        error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
    assert upstream.requests == []
