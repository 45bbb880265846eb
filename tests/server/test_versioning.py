"""Version negotiation at the edge: the 426 matrix, the reference client, header floors."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import codecai
import httpx
import pytest

from proxy.settings import DEFAULT_DOCS_URL
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.policy_support import write_policy

CODEC_BODY = {"prompt": "The capital of France is", "max_tokens": 8, "stream_format": "msgpack"}
JSON_BODY = {"prompt": "The capital of France is", "max_tokens": 8, "stream": True}
CLIENTS: dict[str, str | None] = {
    "absent": None,
    "garbage": "not-a-version",
    "0.0": "0.0",
    "0.2": "0.2",
    "0.3": "v0.3.7",
    "0.4": "0.4",
    "0.5": "0.5.0",
}
BELOW = {"absent", "garbage", "0.0", "0.2", "0.3"}


def headers_for(client: str) -> dict[str, str]:
    value = CLIENTS[client]
    return {} if value is None else {"Codec-Client-Version": value}


async def make(make_proxy: MakeProxy, tmp_path: Path, setup: str) -> ProxyClient:
    choices: dict[str, dict[str, Any]] = {
        "off": {},
        "advisory": {"version_policy": "advisory"},
        "strict": {"version_policy": "strict"},
        "safety-enabled": {"safety_policy": write_policy(tmp_path)},
        "safety-enforced": {
            "safety_policy": write_policy(tmp_path),
            "enforce_safety_policy": True,
            "deployment_id": "test-deployment",
            "docs_url": "https://docs.example/codec-upgrade",
        },
    }
    return await make_proxy(**choices[setup])


@pytest.mark.parametrize(
    "setup", ["off", "advisory", "strict", "safety-enabled", "safety-enforced"]
)
async def test_426_versus_served_matrix(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path, setup: str
) -> None:
    proxy = await make(make_proxy, tmp_path, setup)
    enforced = setup in ("strict", "safety-enforced")
    for client in CLIENTS:
        before = len(upstream.requests)
        async with proxy.post("/v1/completions", json=CODEC_BODY, headers=headers_for(client)) as r:
            await r.read()
            refused = enforced and client in BELOW
            assert r.status == (426 if refused else 200), (setup, client)
        # A 426 is decided before any upstream contact.
        assert len(upstream.requests) == before + (0 if refused else 1)
        # JSON is not Codec traffic: never refused, whatever its version header says.
        async with proxy.post("/v1/completions", json=JSON_BODY, headers=headers_for(client)) as r:
            await r.read()
            assert r.status == 200


async def test_426_is_what_the_reference_client_expects(
    make_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = await make(make_proxy, tmp_path, "safety-enforced")
    origin = str(proxy.make_url("")).rstrip("/")
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{origin}/v1/completions", json=CODEC_BODY, headers={"Codec-Client-Version": "0.3"}
        )
    assert response.status_code == 426
    assert response.headers["Codec-Min-Version"] == "0.4"
    assert response.headers["Codec-Required-Features"] == "safety-policy-enforcement"
    assert response.headers["Upgrade"] == "Codec/0.4"
    assert response.headers["Content-Type"] == "application/json"
    error = codecai.parse_version_required(response)  # raises ValueError on a bad body
    assert error is not None
    assert error.body.minimum_version == "0.4"
    assert error.body.required_features == ("safety-policy-enforcement",)
    assert error.body.client_version == "0.3"
    assert error.body.deployment_id == "test-deployment"
    assert error.body.docs_url == "https://docs.example/codec-upgrade"


@pytest.mark.parametrize("setup", ["strict", "safety-enforced"])
async def test_version_policy_document_agrees_with_the_runtime_426(
    make_proxy: MakeProxy, tmp_path: Path, setup: str
) -> None:
    proxy = await make(make_proxy, tmp_path, setup)
    origin = str(proxy.make_url("")).rstrip("/")
    document = await codecai.discover_version_policy(origin)
    assert document is not None
    async with proxy.get("/.well-known/codec/version-policy.json") as r:
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert r.headers["Content-Type"] == "application/json"
        raw = json.loads(await r.read())
    async with proxy.post("/v1/completions", json=CODEC_BODY) as r:
        assert r.status == 426
        body = json.loads(await r.read())
    assert raw == {k: v for k, v in body.items() if k not in ("error", "client_version")}
    assert document.minimum_version == body["minimum_version"]
    assert list(document.required_features) == body["required_features"]


@pytest.mark.parametrize("setup", ["off", "advisory", "safety-enabled"])
async def test_no_version_policy_document_when_nothing_is_enforced(
    make_proxy: MakeProxy, tmp_path: Path, setup: str
) -> None:
    proxy = await make(make_proxy, tmp_path, setup)
    assert await codecai.discover_version_policy(str(proxy.make_url("")).rstrip("/")) is None
    async with proxy.options(
        "/.well-known/codec/version-policy.json",
        headers={"Access-Control-Request-Headers": "codec-client-version"},
    ) as r:
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Headers"] == "Codec-Client-Version"


FUTURE_HEADERS = (
    ("Content-Type", "application/json"),
    ("Codec-Tokenizer-Map", "sha256:" + "a" * 64),
    ("Codec-Latent-Map", "sha256:" + "b" * 64),
    ("Codec-Safety-Policy", "someone/else"),
    ("codec-safety-policy-hash", "sha256:" + "c" * 64),
    ("Codec-From-The-Future", "1"),
    ("X-Other", "kept"),
)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ("garbage", set()),
        ("0.0", set()),
        ("absent", {"codec-tokenizer-map"}),
        ("0.2", {"codec-tokenizer-map"}),
        ("0.3", {"codec-tokenizer-map", "codec-latent-map"}),
        (
            "0.4",
            {
                "codec-tokenizer-map",
                "codec-latent-map",
                "codec-safety-policy",
                "codec-safety-policy-hash",
            },
        ),
    ],
)
async def test_floors_apply_to_every_response_even_relayed_ones(
    proxy: ProxyClient, upstream: FakeUpstream, client: str, expected: set[str]
) -> None:
    upstream.script = Script(Capture(200, "OK", FUTURE_HEADERS, b"{}"))
    async with proxy.get("/anything", headers=headers_for(client)) as r:
        await r.read()
        names = {name.lower() for name in r.headers}
    assert {n for n in names if n.startswith("codec-")} == expected
    assert "x-other" in names


async def test_unparsable_version_is_logged_once_per_address(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy")
    for _ in range(3):
        async with proxy.post(
            "/v1/completions", json=CODEC_BODY, headers={"Codec-Client-Version": "bogus!"}
        ) as r:
            assert r.status == 200
            await r.read()
    warnings = [rec for rec in caplog.records if "unparsable" in rec.getMessage()]
    assert len(warnings) == 1
    assert "treated as 0.0" in warnings[0].getMessage()


async def test_advisory_mode_serves_and_logs_old_clients_once(
    make_proxy: MakeProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy")
    proxy = await make(make_proxy, tmp_path, "advisory")
    for _ in range(2):
        async with proxy.post("/v1/completions", json=CODEC_BODY, headers=headers_for("0.3")) as r:
            assert r.status == 200
            await r.read()
    notes = [rec for rec in caplog.records if "advisory" in rec.getMessage()]
    assert len(notes) == 1


async def test_upstream_content_filter_is_error_for_old_clients(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    body = (
        b'data: {"choices":[{"text":"Hi","index":0,"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"text":"","index":0,"finish_reason":"content_filter"}]}\n\n'
    )
    sse = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(Capture(200, "OK", sse.headers, body))
    for client, reason in [("0.3", "error"), ("0.4", "policy_violation"), ("absent", "error")]:
        async with proxy.post("/v1/completions", json=CODEC_BODY, headers=headers_for(client)) as r:
            frames = await codecai_frames_of(await r.read())
        assert frames[-1].finish_reason == reason


async def codecai_frames_of(raw: bytes) -> list[codecai.CodecFrame]:
    from tests.codec_client import codecai_frames

    return await codecai_frames(raw, "msgpack")


async def test_426_and_the_policy_document_name_upgrade_docs_by_default(
    make_proxy: MakeProxy,
) -> None:
    # The reference engines always send a docs_url; so does the proxy unless told otherwise.
    proxy = await make_proxy(version_policy="strict")
    async with proxy.post("/v1/completions", json=CODEC_BODY) as resp:
        assert resp.status == 426
        body = json.loads(await resp.read())
    assert body["docs_url"] == DEFAULT_DOCS_URL
    async with proxy.get("/.well-known/codec/version-policy.json") as resp:
        assert json.loads(await resp.read())["docs_url"] == DEFAULT_DOCS_URL
    quiet = await make_proxy(version_policy="strict", docs_url=None)
    async with quiet.post("/v1/completions", json=CODEC_BODY) as resp:
        assert "docs_url" not in json.loads(await resp.read())
