"""The JSON body a Codec request becomes upstream (and the token-ID fields it asks for)."""

from __future__ import annotations

import json

import pytest

from proxy.core.errors import BadRequest
from proxy.core.http.upstream_body import UpstreamRequest


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


def test_completions_ask_for_ids_both_ways() -> None:
    sent = body(UpstreamRequest("completions", {"prompt": "Hi"}), model=None, ask_for_ids=True)
    assert sent["return_token_ids"] is True
    assert sent["logprobs"] == 1


def test_chat_asks_for_logprobs_without_top_logprobs_unless_tools_are_on() -> None:
    fields = {"messages": [], "top_logprobs": 0}
    sent = body(UpstreamRequest("chat", fields), model=None, ask_for_ids=True)
    assert sent["logprobs"] is True
    assert "top_logprobs" not in sent
    tools = body(
        UpstreamRequest("chat", {"messages": [], "tools": [{}]}), model=None, ask_for_ids=True
    )
    assert "logprobs" not in tools
    assert tools["return_token_ids"] is True


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
