"""The JSON body a Codec request becomes upstream (and the token-ID fields it asks for)."""

from __future__ import annotations

import json

import pytest

from proxy.core.errors import BadRequest
from proxy.core.http.upstream_body import Endpoint, UpstreamRequest


def body(request: UpstreamRequest, **kwargs: object) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(request.body(**kwargs))  # type: ignore[arg-type]
    return loaded


def test_fields_go_up_streamed_with_the_default_model_only_when_none_was_named() -> None:
    plain = UpstreamRequest("completions", {"prompt": "Hi", "stream": False})
    assert body(plain, model="m", ask_for_ids=False) == {
        "prompt": "Hi",
        "stream": True,
        "model": "m",
    }
    named = UpstreamRequest("completions", {"prompt": "Hi", "model": "mine"})
    assert body(named, model="m", ask_for_ids=False)["model"] == "mine"


ID_FIELDS = ("return_token_ids", "logprobs", "top_logprobs", "n_probs")
TOOLS = [{"type": "function", "function": {"name": "f"}}]
VLLM = {"return_token_ids": True}
COMPLETIONS_LLAMACPP = {"logprobs": 1}
CHAT_LLAMACPP = {"logprobs": True, "top_logprobs": 1}


def asked(endpoint: Endpoint, fields: dict[str, object], backend: str | None) -> dict[str, object]:
    """The ID and probability fields of the body sent when asking `backend` for IDs."""
    sent = body(UpstreamRequest(endpoint, fields), model=None, ask_for_ids=True, backend=backend)
    return {name: sent[name] for name in ID_FIELDS if name in sent}


@pytest.mark.parametrize(
    ("endpoint", "fields", "backend", "expected"),
    [
        ("completions", {"prompt": "Hi"}, "vllm", VLLM),
        ("completions", {"prompt": "Hi"}, "sglang", VLLM),
        ("completions", {"prompt": "Hi"}, "llamacpp", COMPLETIONS_LLAMACPP),
        ("completions", {"prompt": "Hi"}, None, {**VLLM, **COMPLETIONS_LLAMACPP}),
        ("chat", {"messages": []}, "vllm", VLLM),
        ("chat", {"messages": []}, "sglang", VLLM),
        ("chat", {"messages": []}, "llamacpp", CHAT_LLAMACPP),
        ("chat", {"messages": []}, None, {**VLLM, **CHAT_LLAMACPP}),
        # llama.cpp refuses logprobs with tools in a stream: it has no field for them then.
        ("chat", {"messages": [], "tools": TOOLS}, "vllm", VLLM),
        ("chat", {"messages": [], "tools": TOOLS}, "llamacpp", {}),
        ("chat", {"messages": [], "tools": TOOLS}, None, VLLM),
    ],
)
def test_each_backend_is_asked_in_its_own_field_only(
    endpoint: Endpoint, fields: dict[str, object], backend: str | None, expected: dict[str, object]
) -> None:
    assert asked(endpoint, fields, backend) == expected
    request = UpstreamRequest(endpoint, fields)
    assert request.id_fields(backend) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["vllm", "llamacpp", "sglang", None])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_clients_probability_fields_are_never_sent_with_ours(
    endpoint: Endpoint, backend: str | None
) -> None:
    # A Codec stream carries no probabilities; llama.cpp's n_probs would even override our
    # logprobs count on completions (5 alternatives per token instead of 1).
    fields = {"prompt": "Hi", "messages": [], "logprobs": 5, "top_logprobs": 7, "n_probs": 5}
    sent = asked(endpoint, fields, backend)
    request = UpstreamRequest(endpoint, fields)
    assert sent == request.id_fields(backend)  # type: ignore[arg-type]
    # Not asking for IDs (retokenize, or auto's second try), the client's fields go as sent.
    plain = body(request, model=None, ask_for_ids=False, backend=backend)
    assert (plain["logprobs"], plain["top_logprobs"], plain["n_probs"]) == (5, 7, 5)


def test_non_ascii_text_goes_up_as_utf8() -> None:
    raw = UpstreamRequest("completions", {"prompt": "héllo"}).body(model=None, ask_for_ids=False)
    assert "héllo".encode() in raw


def test_fields_nested_deeper_than_orjson_writes_are_a_400() -> None:
    # orjson parses 1024 levels but writes 254: a Codec request in between is refused before
    # the upstream is contacted, never a 500.
    nested: object = 1
    for _ in range(300):
        nested = [nested]
    request = UpstreamRequest("completions", {"prompt": "Hi", "extra": nested})
    with pytest.raises(BadRequest) as info:
        request.body(model=None, ask_for_ids=False)
    assert (info.value.status_hint, info.value.code) == (400, "invalid_json")


def test_a_long_token_id_prompt_goes_up_as_a_json_array() -> None:
    ids = list(range(100_000))
    sent = body(UpstreamRequest("completions", {"prompt": ids}), model=None, ask_for_ids=False)
    assert sent["prompt"] == ids
