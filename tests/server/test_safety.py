"""The safety policy at the edge: published descriptor, headers, enforcement, no leaks."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path

import codecai
import pytest

from proxy.core.errors import ConfigError
from proxy.server import create_app
from proxy.tokenizers import LoadedTokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.policy_support import (
    PLACEHOLDER,
    SECRETS,
    policy_document,
    v04,
    write_policy,
)

CAPTURE = load_capture("llamacpp-completions-sample.txt")
TEXT = CAPTURE.stream_text()  # ", the city of New Haven was ... skyscrapers and bustling ..."
CODEC_BODY = {"prompt": "Once upon a time", "max_tokens": 32, "stream_format": "msgpack"}


@pytest.fixture
async def policed(make_proxy: MakeProxy, tmp_path: Path) -> ProxyClient:
    return await make_proxy(safety_policy=write_policy(tmp_path))


@pytest.fixture
async def redacting(make_proxy: MakeProxy, tmp_path: Path) -> ProxyClient:
    """The same policy, but its stop string never occurs in the capture."""
    return await make_proxy(safety_policy=write_policy(tmp_path, policy_document("Atlantis")))


# --- publication ------------------------------------------------------------------------------


async def test_descriptor_is_served_under_both_names_with_identical_bytes(
    policed: ProxyClient,
) -> None:
    origin = str(policed.make_url("")).rstrip("/")
    async with policed.post("/v1/completions", json=CODEC_BODY, headers=v04()) as r:
        await r.read()
        policy_id = r.headers["Codec-Safety-Policy"]
        hash_header = r.headers["Codec-Safety-Policy-Hash"]
    assert r.headers["Codec-Safety-Policy-Id"] == policy_id == "test/edge-policy-v1"
    hex_digest = hash_header.removeprefix("sha256:")
    bodies = []
    for path, cache in [
        (f"/.well-known/codec/policies/{policy_id}.json", "max-age=300"),
        (f"/.well-known/codec/policies/sha256/{hex_digest}.json", "immutable"),
    ]:
        async with policed.get(path) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "application/json"
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert cache in r.headers["Cache-Control"]
            bodies.append(await r.read())
    assert bodies[0] == bodies[1]
    assert hashlib.sha256(bodies[0]).hexdigest() == hex_digest
    # The reference client discovers it, by id and by hash (it checks the bytes' sha256).
    by_id = await codecai.discover_safety_policy(origin=origin, id=policy_id)
    by_hash = await codecai.discover_safety_policy(origin=origin, id=policy_id, hash=hash_header)
    assert by_id == by_hash
    assert [c.name for c in by_id.categories] == ["places", "buildings", "sequences"]


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/codec/policies/test/other.json",
        "/.well-known/codec/policies/sha256/" + "0" * 64 + ".json",
        "/.well-known/codec/policies/..%2F..%2Fetc%2Fpasswd",
        "/.well-known/codec/policies/test/edge-policy-v1.json/",
    ],
)
async def test_other_policy_names_are_404(
    policed: ProxyClient, upstream: FakeUpstream, path: str
) -> None:
    async with policed.get(path) as r:
        assert r.status == 404
        await r.read()
    assert upstream.requests == []


async def test_nothing_published_without_a_policy(proxy: ProxyClient) -> None:
    async with proxy.get("/.well-known/codec/policies/test/edge-policy-v1.json") as r:
        assert r.status == 404
    async with proxy.post("/v1/completions", json=CODEC_BODY, headers=v04()) as r:
        await r.read()
        assert not any(name.lower().startswith("codec-safety") for name in r.headers)


@pytest.mark.parametrize("version", [None, "0.2", "0.3", "junk"])
async def test_clients_below_0_4_get_no_safety_headers(
    policed: ProxyClient, version: str | None
) -> None:
    headers = {} if version is None else {"Codec-Client-Version": version}
    async with policed.post("/v1/completions", json=CODEC_BODY, headers=headers) as r:
        await r.read()
        assert r.status == 200
        assert not any(name.lower().startswith("codec-safety") for name in r.headers)


# --- enforcement on Codec streams --------------------------------------------------------------


@pytest.mark.parametrize(("version", "reason"), [("0.4", "policy_violation"), ("0.3", "error")])
async def test_stop_ends_the_codec_stream_and_cancels_the_upstream(
    policed: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    version: str,
    reason: str,
) -> None:
    upstream.script = Script(CAPTURE, delay=0.02)
    headers = {"Codec-Client-Version": version}
    async with policed.post("/v1/completions", json=CODEC_BODY, headers=headers) as r:
        frames = await codecai_frames(await r.read(), "msgpack")
    assert frames[-1].done
    assert frames[-1].finish_reason == reason
    assert sum(f.done for f in frames) == 1
    text = render(codecai_map(smollm2_tokenizer), frames)
    assert "New" not in text
    assert TEXT.startswith(text)
    for _ in range(40):  # the upstream notices the hang-up at its next write
        if upstream.outcomes:
            break
        await asyncio.sleep(0.05)
    assert upstream.outcomes == ["aborted"]


async def test_redact_replaces_spans_in_codec_frames(
    redacting: ProxyClient, upstream: FakeUpstream, smollm2_tokenizer: LoadedTokenizer
) -> None:
    upstream.script = Script(CAPTURE, chunk_size=7)
    async with redacting.post("/v1/completions", json=CODEC_BODY, headers=v04()) as r:
        frames = await codecai_frames(await r.read(), "msgpack")
    assert frames[-1].finish_reason == "length"
    text = render(codecai_map(smollm2_tokenizer), frames)
    # SmolLM2 tokens carry their leading space: " skyscrapers" and " bustling" go whole.
    expected = TEXT.replace(" skyscrapers", PLACEHOLDER).replace(" bustling", PLACEHOLDER)
    assert text == expected
    assert upstream.outcomes == ["complete"]


# --- enforcement on JSON -----------------------------------------------------------------------


async def test_json_stream_stop_sends_content_filter_then_done(
    policed: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(CAPTURE, delay=0.02)
    body = {"prompt": "Once upon a time", "max_tokens": 32, "stream": True}
    async with policed.post("/v1/completions", json=body, headers=v04()) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["Codec-Safety-Policy"] == "test/edge-policy-v1"
        raw = await r.read()
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "content_filter"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert "New" not in text
    assert TEXT.startswith(text)
    for _ in range(40):
        if upstream.outcomes:
            break
        await asyncio.sleep(0.05)
    assert upstream.outcomes == ["aborted"]


@pytest.mark.parametrize(
    "path",
    ["/completions", "/v1/completions/", "//v1//completions", "/v1/%63ompletions",
     "/V1/Completions", "/v1/./completions", "/x/../v1/completions"],
)  # fmt: skip
async def test_every_spelling_of_the_route_is_policed(
    policed: ProxyClient, upstream: FakeUpstream, path: str
) -> None:
    # The backend's router may accept what ours did not match (llama.cpp serves /completions
    # too): with a policy, no spelling of a generation route goes by unchecked.
    upstream.script = Script(CAPTURE)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 32, "stream": True}).encode()
    # A raw request: HTTP clients normalize such paths before sending them.
    reader, writer = await asyncio.open_connection(policed.host, policed.port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
        + b"Content-Type: application/json\r\nCodec-Client-Version: 0.4\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, raw = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content_filter" in raw
    assert b"New" not in raw  # the stop string never got out
    assert upstream.requests[0].path_qs == path  # sent upstream as the client wrote it


@pytest.mark.parametrize("path", ["/completion", "/infill", "/v1/messages", "/v1/responses"])
async def test_generation_routes_the_policy_cannot_read_are_refused(
    policed: ProxyClient, upstream: FakeUpstream, path: str
) -> None:
    async with policed.post(path, json={"prompt": "Once upon a time"}) as r:
        assert r.status == 403
        error = (await r.json())["error"]
    assert error["code"] == "route_not_policed"
    assert upstream.requests == []


async def test_without_a_policy_other_routes_pass_through(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(CAPTURE)
    async with proxy.post("/completion", json={"prompt": "Once upon a time"}) as r:
        assert r.status == 200
        assert await r.read() == CAPTURE.body
    assert upstream.requests[0].path_qs == "/completion"


async def test_json_body_is_redacted(redacting: ProxyClient, upstream: FakeUpstream) -> None:
    document = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": TEXT, "finish_reason": "length"}],
    }
    upstream.script = Script(
        Capture(200, "OK", (("Content-Type", "application/json"),), json.dumps(document).encode())
    )
    async with redacting.post("/v1/completions", json={"prompt": "x", "max_tokens": 32}) as r:
        assert r.status == 200
        policed_document = json.loads(await r.read())
    expected = TEXT.replace(" skyscrapers", PLACEHOLDER).replace(" bustling", PLACEHOLDER)
    assert policed_document["choices"][0]["text"] == expected
    assert policed_document["id"] == "cmpl-1"
    assert json.loads(upstream.requests[0].body) == {"prompt": "x", "max_tokens": 32}


# --- the rules never leave ---------------------------------------------------------------------


async def test_rules_appear_in_no_public_byte(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    tmp_path: Path,
    smollm2_vocabulary: Vocabulary,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy(
        safety_policy=write_policy(tmp_path),
        enforce_safety_policy=True,
        deployment_id="leak-check",
    )
    public: list[bytes] = []

    async def fetch(method: str, path: str, **kwargs: object) -> None:
        async with proxy.request(method, path, **kwargs) as r:  # type: ignore[arg-type]
            public.append(await r.read())
            public.append(json.dumps(list(r.headers.items())).encode())

    upstream.script = Script(CAPTURE)
    policy_id = "test/edge-policy-v1"
    await fetch("GET", f"/.well-known/codec/policies/{policy_id}.json")
    await fetch("GET", "/.well-known/codec/version-policy.json")
    await fetch("OPTIONS", "/.well-known/codec/version-policy.json")
    await fetch("GET", "/.well-known/codec/policies/nope.json")
    await fetch("POST", "/v1/completions", json=CODEC_BODY)  # 426
    await fetch("POST", "/v1/completions", json={**CODEC_BODY, "n": 3}, headers=v04())  # 400
    await fetch("POST", "/v1/completions", json=CODEC_BODY, headers=v04())  # stopped stream
    upstream.script = Script(CAPTURE)
    await fetch("POST", "/v1/completions", json={"prompt": "x", "stream": True}, headers=v04())
    hashed = hashlib.sha256(public[0]).hexdigest()
    await fetch("GET", f"/.well-known/codec/policies/sha256/{hashed}.json")
    # A broken policy file fails at start-up without quoting a rule either.
    broken = policy_document()
    broken["rules"]["regexes"][0]["pattern"] += "("
    (tmp_path / "broken").mkdir()
    settings = pinned_draws.settings(
        upstream=("http://127.0.0.1:9",),
        tokenizer=tmp_path,
        safety_policy=write_policy(tmp_path / "broken", broken),
    )
    with pytest.raises(ConfigError) as caught:
        create_app(settings, smollm2_vocabulary)
    public.append(caught.value.message.encode())
    public += [record.getMessage().encode() for record in caplog.records]
    everything = b"\n".join(public)
    assert b"policy_violation" in everything  # the stream really was stopped...
    for secret in SECRETS:
        assert secret.encode() not in everything, secret
