"""The endpoint table: each row parses its own requests and reads its own chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.core.endpoints import CHAT, COMPLETIONS, Endpoint
from proxy.core.errors import BadRequest
from proxy.core.stream.chunks import ChunkDelta
from proxy.core.wire.prompt_ids import PromptLimits

LIMITS = PromptLimits(100, 10)


def test_completions_row_parses_completion_requests_and_bounds_prompt_ids() -> None:
    body = json.dumps({"prompt": [1, 2], "stream_format": "msgpack"}).encode()
    assert COMPLETIONS.parse_request(body, LIMITS).is_codec
    with pytest.raises(BadRequest):
        COMPLETIONS.parse_request(body, PromptLimits(2, 10))  # ID 2 is outside a 2-token vocabulary


def test_chat_row_parses_chat_requests() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}]}).encode()
    parsed = CHAT.parse_request(body, LIMITS)
    assert not parsed.is_codec
    body = json.dumps({"prompt": "Hi", "stream_format": "msgpack"}).encode()
    with pytest.raises(BadRequest):
        CHAT.parse_request(body, LIMITS)


@pytest.mark.parametrize(
    ("endpoint", "chunk", "text"),
    [
        (COMPLETIONS, {"choices": [{"index": 0, "text": "Hi"}]}, "Hi"),
        (CHAT, {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, "Hi"),
    ],
)
def test_each_row_reads_its_own_text(endpoint: Endpoint, chunk: dict[str, Any], text: str) -> None:
    assert endpoint.streamed_text.get(chunk["choices"][0]) == text
    parsed = endpoint.parse_chunk(json.dumps(chunk))
    assert isinstance(parsed, ChunkDelta)
    assert parsed.text == text


def test_rows_name_their_upstream_paths() -> None:
    assert (COMPLETIONS.upstream_path, CHAT.upstream_path) == (
        "/v1/completions",
        "/v1/chat/completions",
    )
