"""`--token-ids auto|backend|retokenize`, `Codec-Token-Source`, and the fields the proxy adds
upstream (per `--backend`, detected from `/v1/models`), which must never reach a JSON client.
Replays real llama.cpp and vLLM captures."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import UPSTREAM_FIXTURES, FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, default_model
from tests.server.support import frames_of, ids_of, post

ID_FIELDS = ("return_token_ids", "logprobs")
SENT_FIELDS = (*ID_FIELDS, "top_logprobs", "n_probs")


def completion(fmt: str = "msgpack", **extra: object) -> dict[str, object]:
    return {"prompt": "x", "max_tokens": 16, "stream_format": fmt, **extra}


def captured_ids(name: str) -> list[int]:
    """Every ID the capture reports, in order (vLLM `token_ids` / llama.cpp logprob ids)."""
    ids = []
    for event in load_capture(name).events:
        data = event.decode().removeprefix("data: ").strip()
        if data == "[DONE]" or not (choices := json.loads(data)["choices"]):
            continue
        choice = choices[0]
        if choice.get("token_ids"):
            ids += choice["token_ids"]
        elif choice.get("logprobs"):
            ids += [entry["id"] for entry in choice["logprobs"]["content"]]
    return ids


@pytest.mark.parametrize("mode", ["auto", "backend"])
@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
async def test_vllm_token_ids_are_streamed_as_reported(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    mode: str,
    fmt: str,
) -> None:
    capture = load_capture("vllm-completions-token-ids.txt")
    upstream.script = Script(capture, chunk_size=23)
    proxy = await make_proxy(token_ids=mode)
    status, headers, raw = await post(proxy, "/v1/completions", json=completion(fmt))
    assert status == 200
    assert headers["Codec-Token-Source"] == "backend"
    frames = frames_of(raw, fmt)  # type: ignore[arg-type]
    assert ids_of(frames) == captured_ids("vllm-completions-token-ids.txt")
    # ... and the reference client renders the upstream's text from them.
    decoded = await codecai_frames(raw, fmt)
    assert render(codecai_map(smollm2_tokenizer), decoded) == capture.stream_text()


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
async def test_llamacpp_emoji_stream_falls_back_for_the_spans_it_under_reports(
    make_proxy: MakeProxy, upstream: FakeUpstream, fmt: str
) -> None:
    name = "llamacpp-completions-emoji-logprobs.txt"
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())[name]
    upstream.script = Script(load_capture(name))
    proxy = await make_proxy(token_ids="backend")
    status, headers, raw = await post(proxy, "/v1/completions", json=completion(fmt))
    assert status == 200
    assert headers["Codec-Token-Source"] == "backend"
    # The capture reports 6 ids for 12 sampled tokens; the stream carries all 12.
    assert len(captured_ids(name)) == 6
    assert ids_of(frames_of(raw, fmt)) == truth["tokens"]  # type: ignore[arg-type]


async def test_eos_that_never_renders_is_in_the_stream(
    make_proxy: MakeProxy, upstream: FakeUpstream, smollm2_tokenizer: LoadedTokenizer
) -> None:
    name = "llamacpp-completions-eos-logprobs.txt"
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())[name]
    upstream.script = Script(load_capture(name))
    by_mode = {}
    for mode in ("auto", "retokenize"):
        proxy = await make_proxy(token_ids=mode)
        _, headers, raw = await post(proxy, "/v1/completions", json=completion())
        by_mode[headers["Codec-Token-Source"]] = ids_of(frames_of(raw, "msgpack"))
    assert by_mode["backend"] == truth["tokens"]
    assert by_mode["backend"][-1] == 2  # <|im_end|>
    text = load_capture(name).stream_text()
    assert (
        by_mode["retokenized"]
        == smollm2_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    )
    assert by_mode["retokenized"] != truth["tokens"]


async def test_auto_retokenizes_a_stream_without_ids(
    proxy: ProxyClient, upstream: FakeUpstream, smollm2_tokenizer: LoadedTokenizer
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    _, headers, raw = await post(proxy, "/v1/completions", json=completion())
    assert headers["Codec-Token-Source"] == "retokenized"
    expected = smollm2_tokenizer.tokenizer.encode(
        capture.stream_text(), add_special_tokens=False
    ).ids
    assert ids_of(frames_of(raw, "msgpack")) == expected


async def test_backend_mode_without_ids_ends_in_an_error_frame(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"))
    proxy = await make_proxy(token_ids="backend")
    status, headers, raw = await post(proxy, "/v1/completions", json=completion())
    assert status == 200
    assert headers["Codec-Token-Source"] == "backend"
    frames = frames_of(raw, "msgpack")
    assert [(tuple(f.ids), f.finish_reason) for f in frames] == [((), "error")]


async def test_retokenize_mode_asks_for_nothing(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("vllm-completions-token-ids.txt"))
    proxy = await make_proxy(token_ids="retokenize")
    _, headers, _ = await post(proxy, "/v1/completions", json=completion())
    assert headers["Codec-Token-Source"] == "retokenized"
    sent = json.loads(upstream.requests[0].body)
    assert not set(ID_FIELDS) & set(sent)


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/completions", completion(logprobs=5), {"return_token_ids": True, "logprobs": 1}),
        (
            # llama.cpp lists 20 alternatives per token without top_logprobs, none at 0.
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream_format": "protobuf",
             "top_logprobs": 0},
            {"return_token_ids": True, "logprobs": True, "top_logprobs": 1},
        ),
        (
            # llama.cpp refuses logprobs with tools in a stream: only vLLM's field then.
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream_format": "msgpack",
             "tools": [{"type": "function", "function": {"name": "f"}}]},
            {"return_token_ids": True},
        ),
    ],
    ids=["completions", "chat", "chat-with-tools"],
)  # fmt: skip
async def test_fields_added_upstream_while_the_backend_is_unknown(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    path: str,
    body: dict[str, object],
    expected: dict[str, object],
) -> None:
    await post(proxy, path, json=body)
    sent = json.loads(upstream.requests[0].body)
    assert {k: sent[k] for k in (*ID_FIELDS, "top_logprobs") if k in sent} == expected
    assert sent["stream"] is True
    assert "stream_format" not in sent


async def test_auto_asks_again_without_the_fields_an_upstream_refuses(
    proxy: ProxyClient, upstream: FakeUpstream, smollm2_tokenizer: LoadedTokenizer
) -> None:
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture)
    upstream.refuse_fields = ID_FIELDS
    status, headers, raw = await post(proxy, "/v1/completions", json=completion())
    assert status == 200
    assert headers["Codec-Token-Source"] == "retokenized"
    first, second = (json.loads(r.body) for r in upstream.requests)
    assert set(ID_FIELDS) <= set(first)
    assert not set(ID_FIELDS) & set(second)
    assert ids_of(frames_of(raw, "msgpack")) == (
        smollm2_tokenizer.tokenizer.encode(capture.stream_text(), add_special_tokens=False).ids
    )


async def test_backend_mode_passes_the_refusal_on(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.refuse_fields = ID_FIELDS
    proxy = await make_proxy(token_ids="backend")
    status, _, raw = await post(proxy, "/v1/completions", json=completion())
    assert status == 400
    assert "unsupported" in json.loads(raw)["error"]["message"]
    assert len(upstream.requests) == 1


# --- each backend is asked in its own field (--backend, detected from /v1/models) ---------

VLLM = {"return_token_ids": True}
LLAMACPP_COMPLETIONS = {"logprobs": 1}
LLAMACPP_CHAT = {"logprobs": True, "top_logprobs": 1}
LLAMACPP_META = {"meta": {"n_vocab": 49152, "n_ctx": 2048}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream_format": "msgpack"}


def sent_fields(upstream: FakeUpstream, index: int = -1) -> dict[str, object]:
    sent = json.loads(upstream.requests[index].body)
    return {k: sent[k] for k in SENT_FIELDS if k in sent}


async def take_listing(proxy: ProxyClient) -> None:
    """The /v1/models lookup the drift check makes at start (tests/server/test_drift.py runs
    it; the fake here replays captures on /tokenize, so it is off)."""
    await default_model(proxy).listing.listing(fresh=True)


@pytest.mark.parametrize(
    ("model_fields", "server", "completions", "chat"),
    [
        ({"owned_by": "vllm", "max_model_len": 2048}, "uvicorn", VLLM, VLLM),
        ({"owned_by": "sglang", "max_model_len": 2048}, "uvicorn", VLLM, VLLM),
        ({"owned_by": "llamacpp", **LLAMACPP_META}, "llama.cpp", LLAMACPP_COMPLETIONS,
         LLAMACPP_CHAT),
        # No entry says; the header does.
        ({}, "llama.cpp", LLAMACPP_COMPLETIONS, LLAMACPP_CHAT),
        # Nothing says: every backend's field.
        ({"owned_by": "me"}, "uvicorn", {**VLLM, **LLAMACPP_COMPLETIONS},
         {**VLLM, **LLAMACPP_CHAT}),
    ],
    ids=["vllm", "sglang", "llamacpp", "llamacpp-by-server-header", "unknown"],
)  # fmt: skip
async def test_the_detected_backend_is_asked_in_its_own_field(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    model_fields: dict[str, Any],
    server: str,
    completions: dict[str, object],
    chat: dict[str, object],
) -> None:
    upstream.model_fields = model_fields
    upstream.models_server = server
    # Path B's model lookup takes the listing: the very request it was taken for uses it.
    body = msgpack.packb({"prompt_ids": [504, 3575], "max_tokens": 4})
    headers = {"Content-Type": "application/x-msgpack"}
    await post(proxy, "/v1/completions/codec", data=body, headers=headers)
    assert [r.path_qs for r in upstream.requests] == ["/v1/models", "/v1/completions"]
    assert sent_fields(upstream) == completions
    await post(proxy, "/v1/completions", json=completion(logprobs=3, n_probs=5))
    assert sent_fields(upstream) == completions
    await post(proxy, "/v1/chat/completions", json={**CHAT, "top_logprobs": 4})
    assert sent_fields(upstream) == chat


@pytest.mark.parametrize(
    ("model_fields", "capture", "asked"),
    [
        ({"owned_by": "vllm"}, "vllm-completions-token-ids.txt", VLLM),
        ({"owned_by": "llamacpp"}, "llamacpp-completions-logprobs.txt", LLAMACPP_COMPLETIONS),
    ],
    ids=["vllm", "llamacpp"],
)
@pytest.mark.parametrize("mode", ["auto", "backend"])
async def test_the_backends_own_field_brings_its_ids(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    model_fields: dict[str, Any],
    capture: str,
    asked: dict[str, object],
    mode: str,
) -> None:
    upstream.model_fields = model_fields
    upstream.script = Script(load_capture(capture))
    proxy = await make_proxy(token_ids=mode)
    await take_listing(proxy)
    status, headers, raw = await post(proxy, "/v1/completions", json=completion())
    assert status == 200
    assert sent_fields(upstream) == asked
    assert headers["Codec-Token-Source"] == "backend"
    assert ids_of(frames_of(raw, "msgpack")) == captured_ids(capture)


async def test_an_explicit_backend_wins_and_needs_no_lookup(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    upstream.model_fields = {"owned_by": "llamacpp", **LLAMACPP_META}
    proxy = await make_proxy(backend="vllm")
    await post(proxy, "/v1/chat/completions", json=CHAT)
    assert [r.path_qs for r in upstream.requests] == ["/v1/chat/completions"]
    assert sent_fields(upstream) == VLLM
    await take_listing(proxy)  # the listing says llama.cpp: the setting still wins
    await post(proxy, "/v1/chat/completions", json=CHAT)
    assert sent_fields(upstream) == VLLM


async def test_a_new_listing_that_names_another_server_moves_the_field(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.model_fields = {"owned_by": "llamacpp"}
    await take_listing(proxy)
    await post(proxy, "/v1/completions", json=completion())
    assert sent_fields(upstream) == LLAMACPP_COMPLETIONS
    # The drift check asks again every few minutes: a backend replaced by vLLM meanwhile.
    upstream.model_fields = {"owned_by": "vllm"}
    await take_listing(proxy)
    await post(proxy, "/v1/completions", json=completion())
    assert sent_fields(upstream) == VLLM


async def test_auto_does_not_ask_again_when_nothing_was_added(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    # llama.cpp has no ID field for a chat request with tools: its refusal is about something
    # else, and asking again without fields we never added would only repeat it.
    upstream.refuse_fields = ("tools",)
    proxy = await make_proxy(backend="llamacpp")
    tools = [{"type": "function", "function": {"name": "f"}}]
    status, _, _ = await post(proxy, "/v1/chat/completions", json={**CHAT, "tools": tools})
    assert status == 400
    assert len(upstream.requests) == 1
    assert sent_fields(upstream) == {}


# --- JSON clients never see what the proxy adds ---------------------------------------------


@pytest.mark.parametrize(
    ("path", "capture"),
    [
        ("/v1/completions", "vllm-completions-sample.txt"),
        ("/v1/chat/completions", "vllm-chat.txt"),
        ("/v1/chat/completions", "llamacpp-chat-sample.txt"),
    ],
)
@pytest.mark.parametrize("mode", ["auto", "backend"])
async def test_json_requests_and_responses_are_untouched(
    make_proxy: MakeProxy, upstream: FakeUpstream, path: str, capture: str, mode: str
) -> None:
    upstream.script = Script(load_capture(capture))
    proxy = await make_proxy(token_ids=mode)
    body = (
        b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, '
        b'"stream_format": "json", "max_tokens": 8}'
    )
    status, headers, raw = await post(proxy, path, data=body)
    assert status == 200
    assert upstream.requests[0].body == body  # byte for byte: nothing added, nothing removed
    assert raw == load_capture(capture).body
    for field in ID_FIELDS:
        assert field.encode() not in upstream.requests[0].body
    assert "Codec-Token-Source" not in headers
