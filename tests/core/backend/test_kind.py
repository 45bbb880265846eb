"""Which server the upstream is: from its `/v1/models` (entries, then `Server`), or the setting.

llama.cpp's answer is the real capture. No vLLM or SGLang `/v1/models` answer is captured; their
entries below are the shape of those servers' `ModelCard` (vLLM 0.32, SGLang), with the
`owned_by` each writes by default.
"""

from __future__ import annotations

import pytest

from proxy.core.backend.kind import BACKEND_KINDS, backend_kind, detect_kind, entry_kind
from proxy.core.backend.models import parse_models
from tests.core.conftest import read_capture

VLLM_MODELS = (
    b'{"object":"list","data":[{"id":"smollm2","object":"model","created":1795979538,'
    b'"owned_by":"vllm","root":"hf/smollm2-135m-instruct-bf16","parent":null,'
    b'"max_model_len":2048,"permission":[{"id":"modelperm-1","object":"model_permission"}]}]}'
)
SGLANG_MODELS = (
    b'{"object":"list","data":[{"id":"smollm2","object":"model","created":1795979538,'
    b'"owned_by":"sglang","root":"smollm2","parent":null,"max_model_len":2048}]}'
)
# llama-cpp-python's own server (uvicorn): its logprobs carry no IDs.
OTHER_MODELS = b'{"object":"list","data":[{"id":"m","object":"model","owned_by":"me"}]}'


def kind_of(body: bytes, server: str | None) -> str | None:
    return detect_kind((entry.backend for entry in parse_models(200, body)), server)


def server_of(capture_name: str) -> str | None:
    return read_capture(capture_name).headers.get("server")


def test_the_captured_llamacpp_answer_names_llamacpp() -> None:
    capture = read_capture("llamacpp-models.txt")
    assert kind_of(capture.body, server_of("llamacpp-models.txt")) == "llamacpp"
    # ... by its entries alone, whatever the header says.
    assert kind_of(capture.body, None) == "llamacpp"
    assert kind_of(capture.body, "uvicorn") == "llamacpp"


@pytest.mark.parametrize(
    ("body", "kind"),
    [(VLLM_MODELS, "vllm"), (SGLANG_MODELS, "sglang"), (OTHER_MODELS, None)],
    ids=["vllm", "sglang", "other"],
)
def test_vllm_and_sglang_are_told_apart_by_owned_by_alone(body: bytes, kind: str | None) -> None:
    # Both servers answer with the same shape (`root`, `max_model_len`) and `server: uvicorn`
    # (the captured vLLM streams' header).
    assert server_of("vllm-completions-sample.txt") == "uvicorn"
    assert kind_of(body, "uvicorn") == kind


def test_llamacpp_meta_names_it_without_owned_by() -> None:
    assert entry_kind(None, {"n_vocab": 49152, "n_ctx": 2048}) == "llamacpp"
    assert entry_kind(None, {"other": 1}) is None
    assert entry_kind("vllm", {"n_vocab": 49152}) == "vllm"  # owned_by says it first
    assert entry_kind("openai", None) is None


@pytest.mark.parametrize(
    ("server", "kind"),
    [
        ("llama.cpp", "llamacpp"),
        (" LLaMA.cpp ", "llamacpp"),
        ("uvicorn", None),  # vLLM, SGLang, llama-cpp-python: says nothing
        ("Python/3.11 aiohttp/3.14.5", None),
        (None, None),
    ],
)
def test_the_server_header_when_no_entry_says(server: str | None, kind: str | None) -> None:
    assert kind_of(b'{"data": [{"id": "m"}]}', server) == kind
    assert kind_of(b'{"data": []}', server) == kind


def test_entries_naming_different_servers_name_none() -> None:
    body = b'{"data": [{"id": "a", "owned_by": "vllm"}, {"id": "b", "owned_by": "sglang"}]}'
    assert kind_of(body, "llama.cpp") is None
    # Entries that say nothing do not contradict one that does.
    assert kind_of(b'{"data": [{"id": "a", "owned_by": "vllm"}, {"id": "b"}]}', None) == "vllm"


@pytest.mark.parametrize("detected", [*BACKEND_KINDS, None])
def test_an_explicit_setting_wins_over_detection(detected: str | None) -> None:
    for setting in BACKEND_KINDS:
        assert backend_kind(setting, detected) == setting  # type: ignore[arg-type]
    assert backend_kind("auto", detected) == detected  # type: ignore[arg-type]
