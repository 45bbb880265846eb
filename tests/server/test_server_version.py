"""The Codec I-D's version surface (draft-dunn-codec-00, codec-spec.md §3.6, §4): what
`GET /codec/version` lists is what requests get, format by format and model by model, and
`Codec-Server-Version` is where docs/VERSIONING_AND_SAFETY.md says it is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import codecai
import msgpack
import pytest

from proxy.core.http.versioning import SERVER_VERSION_HEADER
from proxy.core.wire.formats import SENT_AS, STREAM_FORMATS
from proxy.core.wire.frames import encoder_for
from proxy.server.models.live import LIVE, build_live
from proxy.server.models.served_models import SERVED_MODELS
from proxy.settings import ModelSettings
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, app_of
from tests.server.support import Decodable, frames_of, ids_of, post

SAMPLE = load_capture("llamacpp-completions-sample.txt")
V05 = {"Codec-Client-Version": "0.5"}


async def version_of(proxy: ProxyClient, **headers: str) -> dict[str, Any]:
    async with proxy.get("/codec/version", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
        document: dict[str, Any] = await resp.json()
    return document


def completion(fmt: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": "The capital of France is", "max_tokens": 16, "stream_format": fmt, **extra}


def path_b(fmt: str) -> dict[str, Any]:
    body = msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 16, "stream_format": fmt})
    return {"data": body, "headers": {"Content-Type": "application/x-msgpack"}}


def is_delta_stream(raw: bytes, fmt: str) -> bool:
    """Whether the frames carry zigzag deltas (`base_id`, `ids_delta`) instead of `ids`."""
    if encoder_for(fmt).content_type != "application/x-msgpack":
        return False  # protobuf has no delta layout (codec-spec.md §11 item 8)
    unpacker = msgpack.Unpacker()
    unpacker.feed(raw)
    return all("ids_delta" in frame for frame in unpacker)


async def _chunks(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


async def test_every_listed_format_is_served_as_itself(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    document = await version_of(proxy)
    listed = document["stream_formats"]
    assert listed
    delta_seen = False
    for fmt in listed:
        for path, kwargs in (
            ("/v1/completions", {"json": completion(fmt)}),
            ("/v1/completions/codec", path_b(fmt)),
        ):
            status, headers, raw = await post(proxy, path, **kwargs)
            assert status == 200, (fmt, path, raw[:200])
            assert headers["Codec-Stream-Format"] == fmt, path
            assert headers["Content-Type"] == encoder_for(fmt).content_type
            frames = frames_of(raw, fmt)
            assert frames[-1].finish_reason == "length"
            delta_seen |= is_delta_stream(raw, fmt)
            # The reference client (codecai 0.4.1) reads the v0.2 formats; the delta format
            # came with v0.5, which a 0.4 client never asks for.
            if fmt in ("msgpack", "protobuf"):
                theirs = [f async for f in codecai.decode_stream(_chunks(raw), fmt)]
                assert [i for f in theirs for i in f.ids] == ids_of(frames)
            else:
                with pytest.raises(ValueError, match="invalid frame shape"):
                    [f async for f in codecai.decode_msgpack_stream(_chunks(raw))]
    # `delta_varint` says whether a listed format really streams deltas.
    assert document["delta_varint"] is delta_seen


async def test_every_format_not_listed_is_answered_as_documented(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    """docs/ENDPOINTS.md: `json` is the backend's stream, relayed; a format the proxy has no
    layout for is answered as the one `SENT_AS` names, which `Codec-Stream-Format` says; any
    other value is a 400 listing what is accepted."""
    listed = set((await version_of(proxy))["stream_formats"])
    unlisted = [fmt for fmt in STREAM_FORMATS if fmt not in listed]
    assert unlisted
    for fmt in unlisted:
        status, headers, raw = await post(proxy, "/v1/completions", json=completion(fmt))
        assert status == 200, fmt
        if fmt not in SENT_AS:
            assert headers["Content-Type"].startswith("text/event-stream")
            assert "Codec-Stream-Format" not in headers
            assert raw == SAMPLE.body
            continue
        sent = SENT_AS[fmt]
        assert sent != fmt
        assert sent in listed
        assert headers["Codec-Stream-Format"] == sent
        assert frames_of(raw, cast(Decodable, sent))[-1].done
    status, _, raw = await post(proxy, "/v1/completions", json=completion("msgpack-compact"))
    assert status == 400
    message = json.loads(raw)["error"]["message"]
    assert message.endswith("supported values: " + ", ".join(STREAM_FORMATS))


async def test_codec_off_lists_no_format_and_serves_none(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(codec_enabled=False)
    document = await version_of(proxy)
    assert (document["stream_formats"], document["delta_varint"]) == ([], False)
    for fmt in SENT_AS:
        status, _, raw = await post(proxy, "/v1/completions", json=completion(fmt))
        assert status == 403, fmt
        assert json.loads(raw)["error"]["code"] == "codec_not_enabled"
    assert upstream.requests == []


async def test_each_model_where_they_differ(
    make_proxy: MakeProxy, upstream: FakeUpstream, upstream_url: str, smollm2_gguf: Path
) -> None:
    models = (
        ModelSettings(name="on", upstreams=(upstream_url,), tokenizer=smollm2_gguf),
        ModelSettings(
            name="off",
            aliases=("off-alias",),
            upstreams=(upstream_url,),
            tokenizer=smollm2_gguf,
            codec_enabled=False,
        ),
    )
    proxy = await make_proxy(upstream=(), tokenizer=None, models=models)
    document = await version_of(proxy)
    # The top level is the default model's (`on`, the first listed); `models` names only those
    # that differ from it, by every name they answer to.
    assert set(document["models"]) == {"off", "off-alias"}
    answers = {"on": document, **document["models"]}
    for name, answer in answers.items():
        for fmt in SENT_AS:
            status, headers, _ = await post(
                proxy, "/v1/completions", json=completion(fmt, model=name)
            )
            if SENT_AS[fmt] in answer["stream_formats"]:
                # As itself when listed, else as the listed format docs/ENDPOINTS.md names.
                assert (status, headers["Codec-Stream-Format"]) == (200, SENT_AS[fmt])
            else:
                assert status == 403, (name, fmt)


async def test_the_answer_follows_a_reload(proxy: ProxyClient) -> None:
    before = await version_of(proxy)
    app = app_of(proxy)
    vocabularies = {model.name: model.vocabulary for model in app[SERVED_MODELS]}
    off = dataclasses.replace(app[LIVE].current.settings, codec_enabled=False)
    app[LIVE].swap(build_live(off, vocabularies))  # as a reload applies it
    after = await version_of(proxy)
    assert before["stream_formats"]
    assert not after["stream_formats"]
    status, _, _ = await post(proxy, "/v1/completions", json=completion("msgpack"))
    assert status == 403


# --- Codec-Server-Version ----------------------------------------------------------------------


async def test_every_codec_stream_says_the_version_to_a_0_5_client(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    document = await version_of(proxy)
    for fmt in document["stream_formats"]:
        _, headers, _ = await post(proxy, "/v1/completions", json=completion(fmt), headers=V05)
        assert headers[SERVER_VERSION_HEADER] == document["version"], fmt


async def test_a_refused_codec_request_says_it_too(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(codec_enabled=False)
    status, headers, _ = await post(
        proxy, "/v1/completions", json=completion("msgpack"), headers=V05
    )
    assert status == 403
    assert headers[SERVER_VERSION_HEADER] == (await version_of(proxy))["version"]


async def test_an_upstream_error_to_a_codec_request_says_it_too(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    """Before the stream starts, the upstream's own error is the answer, as a Codec response."""
    error = load_capture("llamacpp-error-bad-json.txt")
    upstream.script = Script(error)
    status, headers, raw = await post(
        proxy, "/v1/completions", json=completion("msgpack"), headers=V05
    )
    assert (status, raw) == (error.status, error.body)
    assert headers[SERVER_VERSION_HEADER] == (await version_of(proxy))["version"]


@pytest.mark.parametrize(
    "client_headers",
    [{}, codecai.with_codec_client_version(), {"Codec-Client-Version": "garbage"}],
    ids=["absent", "codecai-0.4", "unparsable"],
)
async def test_clients_below_0_5_never_see_it(
    proxy: ProxyClient, client_headers: dict[str, str]
) -> None:
    """Graceful downgrade (codec-spec.md §6): a header only the I-D (version 0.5) defines."""
    for fmt in ("msgpack", "protobuf"):
        status, headers, _ = await post(
            proxy, "/v1/completions", json=completion(fmt), headers=client_headers
        )
        assert status == 200
        assert SERVER_VERSION_HEADER not in headers


async def test_the_backends_own_header_never_reaches_the_client(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    """The proxy is the Codec server here: a JSON stream relayed carries no version header,
    not even the backend's, and a Codec stream carries the proxy's."""
    headers = (*SAMPLE.headers, (SERVER_VERSION_HEADER, "0.9"))
    upstream.script = Script(dataclasses.replace(SAMPLE, headers=headers))
    version = (await version_of(proxy))["version"]
    status, relayed, raw = await post(
        proxy, "/v1/completions", json={"prompt": "Hi", "stream": True}, headers=V05
    )
    assert (status, raw) == (200, SAMPLE.body)
    assert SERVER_VERSION_HEADER not in relayed
    _, codec, _ = await post(proxy, "/v1/completions", json=completion("msgpack"), headers=V05)
    assert codec[SERVER_VERSION_HEADER] == version


@pytest.mark.parametrize(
    "path", ["/codec/version", "/codec/schema", "/.well-known/codec/index.json", "/livez"]
)
async def test_documents_and_probes_carry_none(proxy: ProxyClient, path: str) -> None:
    async with proxy.get(path, headers=V05) as resp:
        assert resp.status == 200
        assert SERVER_VERSION_HEADER not in resp.headers
