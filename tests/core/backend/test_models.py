"""The one `/v1/models` parser: real llama.cpp capture, vLLM's shape, and broken answers."""

from __future__ import annotations

import pytest

from proxy.core.backend.models import ModelEntry, find_model, only_model, parse_models
from proxy.core.errors import UpstreamProtocolError, UpstreamUnavailable
from tests.core.conftest import read_capture

VLLM_MODELS = (
    b'{"object":"list","data":[{"id":"smollm2","object":"model","owned_by":"vllm",'
    b'"root":"hf/smollm2","max_model_len":2048}]}'
)


def test_the_captured_llamacpp_answer() -> None:
    models = parse_models(200, read_capture("llamacpp-models.txt").body)
    assert models == (
        ModelEntry("models/SmolLM2-135M-Instruct.Q4_1.gguf", 49152, 2048, backend="llamacpp"),
    )
    assert only_model(models) == "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_vllm_reports_its_context_but_not_its_vocabulary() -> None:
    assert parse_models(200, VLLM_MODELS) == (ModelEntry("smollm2", None, 2048, backend="vllm"),)


def test_find_by_name_or_the_only_one() -> None:
    models = (ModelEntry("a", 1), ModelEntry("b", 2))
    assert find_model(models, "b") == ModelEntry("b", 2)
    assert find_model(models, None) is None  # two models, no name: none is the one
    assert find_model(models, "c") is None
    assert find_model(models[:1], None) == ModelEntry("a", 1)


@pytest.mark.parametrize(
    "item",
    [
        b'{"id": "m", "meta": {"n_vocab": true, "n_ctx": -1}}',
        b'{"id": "m", "meta": "none", "max_model_len": "2048"}',
    ],
)
def test_odd_counts_are_not_reported(item: bytes) -> None:
    (entry,) = parse_models(200, b'{"data": [' + item + b"]}")
    assert (entry.id, entry.vocab_size, entry.context_length) == ("m", None, None)


def test_entries_without_an_id_are_skipped() -> None:
    body = b'{"data": [{"id": ""}, {"name": "x"}, 7, {"id": "ok"}]}'
    assert parse_models(200, body) == (ModelEntry("ok"),)


@pytest.mark.parametrize("body", [b"nope", b"[]", b'{"data": {}}'])
def test_broken_answers_are_upstream_protocol_errors(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError, match="/v1/models"):
        parse_models(200, body)


def test_a_failed_listing_is_unavailable() -> None:
    with pytest.raises(UpstreamUnavailable, match="answered 503"):
        parse_models(503, b"")


@pytest.mark.parametrize("count", [0, 2])
def test_only_model_needs_exactly_one(count: int) -> None:
    with pytest.raises(UpstreamProtocolError, match="set --model") as info:
        only_model(tuple(ModelEntry(f"m{i}") for i in range(count)))
    assert info.value.code == "model_unknown"
