"""The backends' /tokenize shapes, checked against real captured responses."""

from __future__ import annotations

import json

import pytest

from proxy.core.backend.tokenize_api import LLAMACPP, VLLM, parse_tokens
from proxy.core.errors import UpstreamProtocolError
from tests.core.conftest import read_capture

CAPTURED_IDS = [19556, 28, 905, 17, 216, 18645, 250, 48392, 138, 15107, 232, 227]


@pytest.mark.parametrize("name", ["llamacpp-tokenize.txt", "vllm-tokenize.txt"])
def test_both_captured_answers_parse(name: str) -> None:
    assert parse_tokens(read_capture(name).body) == CAPTURED_IDS


def test_request_bodies() -> None:
    assert json.loads(LLAMACPP.request_body("Hi", "ignored")) == {
        "content": "Hi",
        "add_special": False,
        "parse_special": False,
    }
    assert json.loads(VLLM.request_body("Hi", None)) == {
        "prompt": "Hi",
        "add_special_tokens": False,
    }
    assert json.loads(VLLM.request_body("Hi", "m"))["model"] == "m"


@pytest.mark.parametrize(
    "body", [b"not json", b"[]", b'{"tokens": "1 2"}', b'{"tokens": [1, true]}', b"{}"]
)
def test_broken_answers_are_upstream_errors(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError, match="/tokenize"):
        parse_tokens(body)
