"""Continuous verification: sampled streams decoded with the published map, as a client would
(proxy/server/models/verification.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from codecai import Detokenizer, TokenizerMap

from proxy import assets
from proxy.core.backend.drift import DriftState
from proxy.server import create_app
from proxy.server.models.served_models import SERVED_MODELS
from proxy.server.models.verification import _DECODERS
from proxy.server.process.reload import reload_config
from proxy.settings import ModelSettings, Settings
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    ProxyClient,
    app_of,
    default_model,
)
from tests.server.support import frames_of, post, with_swapped_map_ids
from tests.server.test_drift import TokenizingBackend

CAPTURE = "llamacpp-completions-sample.txt"
CODEC = {"prompt": "Hi", "max_tokens": 32, "stream_format": "msgpack"}
PATH_B_ROUTE = "/v1/completions/codec"


async def serving(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    vocabulary: Vocabulary | Mapping[str, Vocabulary],
    **changes: Any,
) -> ProxyClient:
    settings = replace(settings, **changes)
    proxy = await aiohttp_client(create_app(settings, vocabulary))
    if settings.verify_sample_rate > 0:  # else nothing is sampled, so nothing is built
        await decoders_built(proxy)
    return proxy


async def decoders_built(proxy: ProxyClient) -> None:
    """Every model's decoder, built off the loop at start (else sampled streams are skipped,
    and a test about verdicts would test nothing)."""
    digests = {model.published.digest for model in app_of(proxy)[SERVED_MODELS]}
    # Qwen3's 151k-entry map takes seconds to build on a loaded 2-core machine.
    for _ in range(3000):
        if digests <= _DECODERS.keys():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"map decoders not built after 30 s: {sorted(digests - _DECODERS.keys())}")


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


async def access_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The access log's records, once there is one: a stream's is logged when its handler has
    returned, which may be after its client read the whole body."""
    for _ in range(150):
        found = [r.fields for r in caplog.records if hasattr(r, "fields")]
        if found:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError("no access-log line")


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
    caplog.set_level(logging.ERROR, logger="codec_proxy")
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    status, headers, raw = await post(
        proxy, "/v1/completions", json=CODEC, headers={"X-Request-Id": "req-verify-1"}
    )
    assert status == 200
    assert frames_of(raw, "msgpack")[-1].done  # the client still got its whole stream
    [access] = await access_records(caplog)
    [line] = [r.getMessage() for r in caplog.records if "verification mismatch" in r.getMessage()]
    # The proxy's own id, which its access-log line has, beside the client's (only its claim).
    assert f"request {access['id']} (X-Request-Id req-verify-1)," in line
    assert "at byte 0" in line  # the swapped IDs are the text's first ones
    # Never the text: no run of three of its words is in the line.
    words = text.split()
    assert not any(" ".join(words[i : i + 3]) in line for i in range(len(words) - 2))
    assert (
        'codec_proxy_verify_mismatches_total{model="default",token_source="retokenized"} 1.0'
        in await metrics(proxy)
    )
    assert headers["Codec-Tokenizer-Map"].split()[1] in line


PATH_B = {
    "data": msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 4}),
    "headers": {"Content-Type": "application/x-msgpack", "Codec-Model": "bad"},
}


async def refusing_deployment(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
) -> ProxyClient:
    """Two models on one backend that tokenizes as SmolLM2 (so the drift check matches):
    `bad`, the default, publishes a map whose IDs decode to other text; `good` a right one.
    Two mismatches refuse Codec."""
    backend = TokenizingBackend(smollm2_vocabulary.loaded)
    server = await aiohttp_server(backend.app())
    url = (str(server.make_url("")).rstrip("/"),)
    text = load_capture(CAPTURE).stream_text()
    settings = pinned_draws.settings(
        models=(
            ModelSettings("bad", url, smollm2_gguf, map_id="smol-swapped"),
            ModelSettings("good", url, smollm2_gguf),
        ),
        verify_sample_rate=1.0,
        verify_refuse_after=2,
    )
    vocabularies = {
        "bad": with_swapped_map_ids(smollm2_vocabulary, text),
        "good": smollm2_vocabulary,
    }
    return await serving(aiohttp_client, settings, vocabularies)


async def codec(proxy: ProxyClient, model: str) -> tuple[int, dict[str, str], bytes]:
    return await post(proxy, "/v1/completions", json={**CODEC, "model": model})


async def trip(proxy: ProxyClient) -> None:
    """Two mismatching streams of `bad`: each served whole, the second refusing what follows."""
    for _ in range(2):
        status, _, raw = await codec(proxy, "bad")
        assert status == 200
        assert frames_of(raw, "msgpack")[-1].done
    assert (await codec(proxy, "bad"))[0] == 503


async def test_a_verification_refusal_refuses_codec_for_its_model_only(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
) -> None:
    proxy = await refusing_deployment(
        aiohttp_client, aiohttp_server, smollm2_gguf, smollm2_vocabulary
    )
    json_request = {"model": "bad", "prompt": "Hi", "stream": True}
    status, _, json_before = await post(proxy, "/v1/completions", json=json_request)
    assert (status, json_before) == (200, load_capture(CAPTURE).body)
    await trip(proxy)
    # Codec for `bad`, Path A and Path B alike: 503, and when to ask again.
    for status, headers, raw in (
        await codec(proxy, "bad"),
        await post(proxy, PATH_B_ROUTE, **PATH_B),
    ):
        assert status == 503
        error = json.loads(raw)["error"]
        assert (error["code"], error["type"]) == ("verification_mismatch", "service_unavailable")
        assert "JSON requests are served" in error["message"]
        # Until the next drift check (drift_check_interval 300 s), which may lift it.
        assert 1 <= int(headers["Retry-After"]) <= 300
    # JSON for the refused model, byte for byte as before.
    status, _, json_after = await post(proxy, "/v1/completions", json=json_request)
    assert (status, json_after) == (200, json_before)
    # The other model's Codec is served.
    status, _, raw = await codec(proxy, "good")
    assert status == 200
    assert frames_of(raw, "msgpack")[-1].done
    # The pod stays ready: the refusal is reported, as not blocking.
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200
        report = await resp.json()
    assert (report["status"], report["reasons"]) == ("ready", [])
    bad = report["models"]["bad"]
    assert (bad["ready"], bad["codec"]) == (True, False)
    assert bad["checks"]["verification"] == {
        "ready": True,
        "reason": "verification_mismatch",
        "refuses_codec": True,
    }
    good = report["models"]["good"]
    assert (good["ready"], good["codec"]) == (True, True)
    assert "verification" not in good["checks"]
    text = await metrics(proxy)
    for line in (
        'codec_proxy_codec_available{model="bad"} 0.0',
        'codec_proxy_model_ready{model="bad"} 1.0',
        'codec_proxy_codec_available{model="good"} 1.0',
        'codec_proxy_codec_refused_total{model="bad",reason="verification_mismatch"} 3.0',
    ):
        assert line in text


@pytest.mark.parametrize("lift", ["reload", "clean drift check"])
async def test_a_refusal_is_lifted_and_the_window_starts_again_empty(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    lift: str,
) -> None:
    proxy = await refusing_deployment(
        aiohttp_client, aiohttp_server, smollm2_gguf, smollm2_vocabulary
    )
    app = app_of(proxy)
    bad = app[SERVED_MODELS].models["bad"]
    await trip(proxy)
    if lift == "reload":
        assert (await reload_config(app)).ok
    else:
        assert bad.drift is not None
        assert await bad.drift.check()
        assert bad.drift.verdict.state is DriftState.MATCHED
    assert 'codec_proxy_codec_available{model="bad"} 1.0' in await metrics(proxy)
    async with proxy.get("/readyz") as resp:
        assert "verification" not in (await resp.json())["models"]["bad"]["checks"]
    # The mismatches that caused it went with it: one more does not refuse again, two do.
    await trip(proxy)


async def test_a_clean_drift_check_keeps_mismatches_that_have_not_refused(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
) -> None:
    """The drift check does not look at the map: a clean one is no reason to forget a
    mismatch, only to lift a refusal."""
    proxy = await refusing_deployment(
        aiohttp_client, aiohttp_server, smollm2_gguf, smollm2_vocabulary
    )
    bad = app_of(proxy)[SERVED_MODELS].models["bad"]
    assert (await codec(proxy, "bad"))[0] == 200
    assert bad.drift is not None
    assert await bad.drift.check()
    assert (await codec(proxy, "bad"))[0] == 200
    assert (await codec(proxy, "bad"))[0] == 503


async def test_without_a_drift_check_a_refusal_says_to_retry_after_its_interval(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    smollm2_vocabulary: Vocabulary,
    upstream: FakeUpstream,
) -> None:
    capture = load_capture(CAPTURE)
    upstream.script = Script(capture, chunk_size=7)
    bad = with_swapped_map_ids(smollm2_vocabulary, capture.stream_text())
    proxy = await serving(
        aiohttp_client,
        settings,
        bad,
        verify_sample_rate=1.0,
        verify_refuse_after=1,
        drift_check_interval=120.0,
    )
    assert (await post(proxy, "/v1/completions", json=CODEC))[0] == 200
    status, headers, _ = await post(proxy, "/v1/completions", json=CODEC)
    assert (status, headers["Retry-After"]) == (503, "120")
    async with proxy.get("/readyz") as resp:
        assert resp.status == 200


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
    assert (tuple(frames[-1].ids), frames[-1].finish_reason) == ((), "error")
    ids = [i for frame in frames for i in frame.ids]
    assert smollm2_vocabulary.loaded.tokenizer.decode(ids) == "Hello world, a"
    metrics_text = await metrics(proxy)
    assert 'codec_proxy_verify_streams_total{model="default",result="mismatch"} 1.0' in (
        metrics_text
    )
