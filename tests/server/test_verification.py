"""Continuous verification: sampled streams decoded with the published map, as a client would
(proxy/server/models/verification.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from codecai import Detokenizer, TokenizerMap

from proxy import assets
from proxy.server import create_app
from proxy.server.models.verification import _DECODERS
from proxy.server.process.reload import reload_config
from proxy.settings import Settings
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    ProxyClient,
    ProxyTestServer,
    app_of,
    default_model,
)
from tests.server.support import frames_of, post, with_swapped_map_ids

CAPTURE = "llamacpp-completions-sample.txt"
CODEC = {"prompt": "Hi", "max_tokens": 32, "stream_format": "msgpack"}


async def serving(
    aiohttp_client: AiohttpClient, settings: Settings, vocabulary: Vocabulary, **changes: Any
) -> ProxyClient:
    app = create_app(replace(settings, **changes), vocabulary)
    proxy = await aiohttp_client(ProxyTestServer(app))
    digest = default_model(proxy).published.digest
    for _ in range(3000):  # the decoder is built off the loop at start
        if digest in _DECODERS:
            break
        await asyncio.sleep(0.01)
    return proxy


async def metrics(proxy: ProxyClient) -> str:
    async with proxy.get("/metrics") as resp:
        return await resp.text()


async def test_streams_that_decode_to_the_text_match(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    upstream.script = Script(load_capture(CAPTURE), chunk_size=7)
    proxy = await serving(aiohttp_client, settings, smollm2_vocabulary, verify_sample_rate=1.0)
    for fmt in ("msgpack", "protobuf"):
        status, _, raw = await post(proxy, "/v1/completions", json={**CODEC, "stream_format": fmt})
        assert status == 200
        frames_of(raw, fmt)
    text = await metrics(proxy)
    assert 'codec_proxy_verify_streams_total{model="default",result="match"} 2.0' in text
    assert (
        'codec_proxy_verify_mismatches_total{model="default",token_source="retokenized"} 0.0'
        in text
    )


async def test_a_map_that_decodes_otherwise_is_counted_and_logged_without_text(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture = load_capture(CAPTURE)
    text = capture.stream_text()
    upstream.script = Script(capture, chunk_size=7)
    bad = with_swapped_map_ids(smollm2_vocabulary, text)
    proxy = await serving(aiohttp_client, settings, bad, verify_sample_rate=1.0)
    with caplog.at_level(logging.ERROR, logger="codec_proxy"):
        status, headers, raw = await post(
            proxy, "/v1/completions", json=CODEC, headers={"X-Request-Id": "req-verify-1"}
        )
    assert status == 200
    assert frames_of(raw, "msgpack")[-1].done  # the client still got its whole stream
    [line] = [r.getMessage() for r in caplog.records if "verification mismatch" in r.getMessage()]
    assert "req-verify-1" in line
    assert "at byte 0" in line  # the swapped IDs are the text's first ones
    # Never the text: no run of three of its words is in the line.
    words = text.split()
    assert not any(" ".join(words[i : i + 3]) in line for i in range(len(words) - 2))
    assert (
        'codec_proxy_verify_mismatches_total{model="default",token_source="retokenized"} 1.0'
        in await metrics(proxy)
    )
    assert headers["Codec-Tokenizer-Map"].split()[1] in line


async def test_refused_after_n_mismatches_until_a_clean_drift_check(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    capture = load_capture(CAPTURE)
    upstream.script = Script(capture, chunk_size=7)
    bad = with_swapped_map_ids(smollm2_vocabulary, capture.stream_text())
    proxy = await serving(
        aiohttp_client, settings, bad, verify_sample_rate=1.0, verify_refuse_after=2
    )
    for _ in range(2):
        assert (await post(proxy, "/v1/completions", json=CODEC))[0] == 200
    status, _, raw = await post(proxy, "/v1/completions", json=CODEC)
    assert status == 503
    assert b"verification_mismatch" in raw
    # JSON keeps flowing, and /readyz says why.
    json_status, _, _ = await post(proxy, "/v1/completions", json={"prompt": "Hi", "stream": True})
    assert json_status == 200
    async with proxy.get("/readyz") as resp:
        report = await resp.json()
    assert resp.status == 503
    assert {"check": "verification", "reason": "verification_mismatch", "model": "default"} in (
        report["reasons"]
    )
    assert 'codec_proxy_codec_available{model="default"} 0.0' in await metrics(proxy)
    # A reload lifts the refusal (so does a drift check that matches: served_models.py).
    result = await reload_config(app_of(proxy))
    assert result.ok
    assert (await post(proxy, "/v1/completions", json=CODEC))[0] == 200
    assert 'codec_proxy_codec_available{model="default"} 1.0' in await metrics(proxy)


async def test_rate_zero_verifies_nothing(
    aiohttp_client: AiohttpClient, settings: Settings, smollm2_vocabulary: Vocabulary
) -> None:
    proxy = await serving(aiohttp_client, settings, smollm2_vocabulary, verify_sample_rate=0.0)
    assert (await post(proxy, "/v1/completions", json=CODEC))[0] == 200
    assert "codec_proxy_verify_streams_total{" not in await metrics(proxy)


async def test_ids_a_corrupting_upstream_slips_in_are_caught(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    """A replay that reports an ID in a chunk with no text: the backend-ID check must send it
    where it was reported (a tool-call region looks just so), so
    only a client-side decode of what was sent can tell that it is text nobody streamed."""
    banana = smollm2_vocabulary.loaded.tokenizer.encode(" banana", add_special_tokens=False).ids
    chunk = {"choices": [{"index": 0, "text": "", "token_ids": banana}]}
    upstream.script = Script(
        load_capture("vllm-completions-token-ids.txt"),
        inject_after_events=3,
        inject=b"data: " + json.dumps(chunk).encode() + b"\n\n",
    )
    proxy = await serving(aiohttp_client, settings, smollm2_vocabulary, verify_sample_rate=1.0)
    status, headers, raw = await post(proxy, "/v1/completions", json=CODEC)
    assert status == 200
    assert headers["Codec-Token-Source"] == "backend"
    sent = [i for frame in frames_of(raw, "msgpack") for i in frame.ids]
    assert all(i in sent for i in banana)  # it reached the client
    text = await metrics(proxy)
    assert 'codec_proxy_verify_mismatches_total{model="default",token_source="backend"} 1.0' in text
    assert 'codec_proxy_verify_streams_total{model="default",result="mismatch"} 1.0' in text


async def test_a_stop_string_reported_with_no_text_is_not_sent_and_matches(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    # llama.cpp with `stop: [" has"]` reports " has" in a chunk with text "", then finishes: a
    # JSON client's answer ends before it, so must a Codec client's, and the verifier agrees.
    upstream.script = Script(load_capture("llamacpp-completions-stop-logprobs.txt"), chunk_size=7)
    proxy = await serving(aiohttp_client, settings, smollm2_vocabulary, verify_sample_rate=1.0)
    status, headers, raw = await post(proxy, "/v1/completions", json=CODEC)
    assert (status, headers["Codec-Token-Source"]) == (200, "backend")
    assert [i for frame in frames_of(raw, "msgpack") for i in frame.ids] == [
        7042,  # " Paris"
        30,
        198,
        198,
        504,
        1797,
        1918,  # " States", and not 553 " has"
    ]
    text = await metrics(proxy)
    assert 'codec_proxy_verify_streams_total{model="default",result="match"} 1.0' in text
    assert 'result="mismatch"' not in text


_VOCABULARIES: dict[str, Vocabulary] = {}


def vocabulary_of(name: str) -> Vocabulary:
    if name not in _VOCABULARIES:
        path = {"qwen3": assets.QWEN3_TOKENIZER, "mistral": assets.MISTRAL_TOKENIZER}[name]
        _VOCABULARIES[name] = Vocabulary.build(load_tokenizer(path.ensure()))
    return _VOCABULARIES[name]


def text_stream(text: str, size: int = 3) -> Capture:
    events = [
        {"choices": [{"index": 0, "text": text[i : i + size], "finish_reason": None}]}
        for i in range(0, len(text), size)
    ]
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return Capture(200, "OK", (("Content-Type", "text/event-stream"),), body + b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        # Qwen3's NFC would compose these; SentencePiece reads a literal "▁" as a space.
        ("qwen3", "Un cafe\u0301 et l'\u212bngstro\u0308m, x\u0344y."),
        ("mistral", "a\u2581b, \u2581 and \u2581\u2581 at the end\u2581"),
    ],
)
async def test_retokenized_text_a_tokenizer_would_change_reaches_the_client_as_streamed(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    upstream: FakeUpstream,
    name: str,
    text: str,
) -> None:
    vocabulary = vocabulary_of(name)
    upstream.script = Script(text_stream(text), chunk_size=7)
    proxy = await serving(aiohttp_client, settings, vocabulary, verify_sample_rate=1.0)
    status, headers, raw = await post(proxy, "/v1/completions", json=CODEC)
    assert (status, headers["Codec-Token-Source"]) == (200, "retokenized")
    frames = frames_of(raw, "msgpack")
    assert frames[-1].finish_reason == "length"
    # codecai, reading the published map, shows the streamed text (a SentencePiece map: after
    # the space it prepends to a text).
    published = TokenizerMap.from_json(default_model(proxy).published.body)
    shown = Detokenizer(published).render([i for frame in frames for i in frame.ids])
    assert shown in (text, " " + text)
    metrics_text = await metrics(proxy)
    assert 'codec_proxy_verify_streams_total{model="default",result="match"} 1.0' in metrics_text
    assert 'result="mismatch"' not in metrics_text


async def test_text_the_vocabulary_cannot_spell_ends_the_stream_and_counts_as_a_mismatch(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    # SmolLM2 has no token for the byte 0x16: the model cannot have written it, so the backend
    # is not using this tokenizer. The client gets the text before it and an error frame, and
    # verification says the IDs did not reach the text.
    upstream.script = Script(text_stream("Hello world, a\x16b and more."), chunk_size=7)
    proxy = await serving(aiohttp_client, settings, smollm2_vocabulary, verify_sample_rate=1.0)
    status, _, raw = await post(proxy, "/v1/completions", json=CODEC)
    assert status == 200
    frames = frames_of(raw, "msgpack")
    assert (frames[-1].ids, frames[-1].finish_reason) == ((), "error")
    ids = [i for frame in frames for i in frame.ids]
    assert smollm2_vocabulary.loaded.tokenizer.decode(ids) == "Hello world, a"
    metrics_text = await metrics(proxy)
    assert 'codec_proxy_verify_streams_total{model="default",result="mismatch"} 1.0' in (
        metrics_text
    )
