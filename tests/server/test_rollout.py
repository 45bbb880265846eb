"""Who gets Codec: the rollout switches answer one stable 403 before any upstream contact, and
never touch a JSON request (proxy/core/http/access.py, docs/ROLLOUT.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import codecai
import httpx
import msgpack
import pytest

from proxy.settings import ModelSettings
from tests.fake_upstream import FakeUpstream, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.policy_support import v04, write_policy
from tests.server.raw_http import RawResponse, connections, request
from tests.server.support import frames_of, post

CODEC = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}
JSON = {"prompt": "Hi", "max_tokens": 8, "stream": True}
PATH_B = msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 8})
SAMPLE = load_capture("llamacpp-completions-sample.txt")  # what the fake upstream streams


def relayed_json(status: int, headers: dict[str, str], raw: bytes) -> None:
    """The upstream's SSE, relayed as it came: what a JSON request gets, Codec allowed or not."""
    assert status == 200, raw
    assert headers["Content-Type"].startswith("text/event-stream")
    assert raw == SAMPLE.body


def served_codec(status: int, headers: dict[str, str], raw: bytes) -> None:
    """A whole msgpack Codec stream, not JSON."""
    assert status == 200, raw
    assert "Codec-Tokenizer-Map" in headers
    assert frames_of(raw, "msgpack")[-1].finish_reason == "length"


def refused(status: int, raw: bytes) -> dict[str, Any]:
    assert status == 403, raw
    error: dict[str, Any] = json.loads(raw)["error"]
    assert error["code"] == "codec_not_enabled"
    assert error["param"] == "stream_format"
    assert "without stream_format" in error["message"]
    return error


async def test_codec_off_refuses_every_codec_route_before_the_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(codec_enabled=False)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "stream_format": "protobuf"}
    for path, kwargs in (
        ("/v1/completions", {"json": CODEC}),
        ("/v1/chat/completions", {"json": chat}),
        ("/v1/completions/codec", {"data": PATH_B,
                                   "headers": {"Content-Type": "application/x-msgpack"}}),
    ):  # fmt: skip
        refused(*(await post(proxy, path, **kwargs))[::2])
    assert upstream.requests == []
    # JSON is never affected: the very same request without stream_format is served.
    relayed_json(*await post(proxy, "/v1/completions", json=JSON))


async def test_the_refusal_is_decided_before_the_version_gate(make_proxy: MakeProxy) -> None:
    # No upgrade would help a client that may not have Codec: the answer is not a 426.
    proxy = await make_proxy(codec_enabled=False, version_policy="strict")
    status, _, raw = await post(
        proxy, "/v1/completions", json=CODEC, headers={"Codec-Client-Version": "0.2"}
    )
    refused(status, raw)


@pytest.mark.parametrize(
    ("changes", "key", "client", "allowed"),
    [
        ({"codec_allow_keys": ("team-a",)}, "team-a", None, True),
        ({"codec_allow_keys": ("team-a",)}, "team-b", None, False),
        ({"codec_allow_keys": ("team-a",)}, None, None, False),
        ({"codec_deny_keys": ("team-b",)}, "team-b", None, False),
        ({"codec_deny_keys": ("team-b",)}, "team-a", None, True),
        ({"codec_client_header": "X-Client", "codec_allow_clients": ("web/*",)}, None, "web/2",
         True),
        ({"codec_client_header": "X-Client", "codec_allow_clients": ("web/*",)}, None, "cli/1",
         False),
        ({"codec_client_header": "X-Client", "codec_deny_clients": ("web/1.0",)}, None, "web/1.0",
         False),
    ],
)  # fmt: skip
async def test_allow_and_deny_lists(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    changes: dict[str, Any],
    key: str | None,
    client: str | None,
    allowed: bool,
) -> None:
    proxy = await make_proxy(**changes)
    headers = {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if client is not None:
        headers["X-Client"] = client
    status, response_headers, raw = await post(
        proxy, "/v1/completions", json=CODEC, headers=headers
    )
    if allowed:
        served_codec(status, response_headers, raw)
    else:
        refused(status, raw)
        assert upstream.requests == []
    relayed_json(*await post(proxy, "/v1/completions", json=JSON, headers=headers))


async def test_one_model_off_leaves_the_others_on(
    make_proxy: MakeProxy, upstream_url: str, smollm2_gguf: Any
) -> None:
    models = (
        ModelSettings(name="on", upstreams=(upstream_url,), tokenizer=smollm2_gguf),
        ModelSettings(
            name="off", upstreams=(upstream_url,), tokenizer=smollm2_gguf, codec_enabled=False
        ),
    )
    proxy = await make_proxy(upstream=(), tokenizer=None, models=models)
    status, _, raw = await post(proxy, "/v1/completions", json={**CODEC, "model": "off"})
    assert "'off'" in refused(status, raw)["message"]
    served_codec(*await post(proxy, "/v1/completions", json={**CODEC, "model": "on"}))
    relayed_json(*await post(proxy, "/v1/completions", json={**JSON, "model": "off"}))
    async with proxy.get("/metrics") as resp:
        text = await resp.text()
    assert 'codec_proxy_codec_refused_total{model="off",reason="codec_not_enabled"} 1.0' in text
    assert 'codec_proxy_codec_available{model="off"} 0.0' in text
    assert 'codec_proxy_codec_available{model="on"} 1.0' in text


async def _body(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


async def test_what_codecai_makes_of_the_refusal(make_proxy: MakeProxy) -> None:
    """The reference client has no fallback of its own (interop.md §1): it must not mistake the
    answer for a version demand, nor the JSON error body for frames."""
    proxy = await make_proxy(codec_enabled=False)
    url = str(proxy.make_url("/v1/completions"))
    headers = codecai.with_codec_client_version()
    async with httpx.AsyncClient() as client:
        response = await client.post(url, json=CODEC, headers=headers)
        assert response.status_code == 403
        # A 426 would be parsed as "upgrade to ..."; this one is not a version problem.
        assert codecai.parse_version_required(response) is None
        with pytest.raises(ValueError, match="msgpack"):
            [frame async for frame in codecai.decode_msgpack_stream(_body(response.content))]
        # What docs/ROLLOUT.md tells a client to do: the same request without stream_format.
        retried = await client.post(url, json=JSON, headers=headers)
    assert retried.status_code == 200
    assert retried.headers["Content-Type"].startswith("text/event-stream")


# Spellings the router does not match but a backend's may (llama.cpp also serves /completions;
# FastAPI redirects a trailing slash): each must meet the switches as its route does, or an
# upstream that serves Codec itself answers it with frames no switch allowed.
CHAT_CODEC = {"messages": [{"role": "user", "content": "Hi"}], "stream_format": "msgpack"}
SPELLINGS = {
    "completions": (
        "/v1/completions/",
        "//v1/completions",
        "/v1//completions",
        "/V1/Completions",
        "/v1/./completions",
        "/x/../v1/completions",
        "/v1/%63ompletions",
        "/completions/",
    ),
    "chat": ("/v1/chat/completions/", "//v1/chat/completions", "/V1/CHAT/COMPLETIONS"),
    "path-b": ("/v1/completions/codec/", "//v1/completions/codec", "/v1/completions/./codec"),
}
SPELLED_BODIES = {
    "completions": (json.dumps(CODEC).encode(), "application/json"),
    "chat": (json.dumps(CHAT_CODEC).encode(), "application/json"),
    "path-b": (PATH_B, "application/x-msgpack"),
}
SWITCHES = [
    {"codec_enabled": False},
    {"codec_allow_keys": ("team-a",)},
    {"codec_client_header": "X-Client", "codec_deny_clients": ("web/*",)},
]


async def raw_post(proxy: ProxyClient, path: str, kind: str) -> RawResponse:
    body, content_type = SPELLED_BODIES[kind]
    headers = {"Content-Type": content_type, "X-Client": "web/1", **v04()}
    async with connections() as connect:
        # A raw request: HTTP clients normalize such paths before they send them.
        connection = await connect(proxy)
        await connection.send(request("POST", path, body, headers=headers))
        return await connection.response()


@pytest.mark.parametrize("policy", [False, True], ids=["no-policy", "policy"])
@pytest.mark.parametrize("switch", SWITCHES, ids=["off", "allow-keys", "deny-clients"])
async def test_every_spelling_of_a_codec_route_meets_the_switches(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    tmp_path: Path,
    switch: dict[str, Any],
    policy: bool,
) -> None:
    changes = dict(switch)
    if policy:
        changes["safety_policy"] = write_policy(tmp_path)
    proxy = await make_proxy(**changes)
    for kind, paths in SPELLINGS.items():
        for path in paths:
            response = await raw_post(proxy, path, kind)
            refused(response.status, response.body)
    assert upstream.requests == []


@pytest.mark.parametrize("kind", SPELLINGS)
async def test_a_spelling_allowed_codec_is_served_as_its_route(
    make_proxy: MakeProxy, upstream: FakeUpstream, kind: str
) -> None:
    proxy = await make_proxy()
    path = SPELLINGS[kind][0]
    response = await raw_post(proxy, path, kind)
    assert response.status == 200, response.body
    assert frames_of(response.body, "msgpack")[-1].done
    # (Path B asks the upstream's /v1/models for the model's name first.)
    (sent,) = [r for r in upstream.requests if r.method == "POST"]
    # Sent as the client wrote it (Path B has no upstream path of its own), as Codec asks.
    assert sent.path_qs == ("/v1/completions" if kind == "path-b" else path)
    assert json.loads(sent.body)["stream"] is True
