"""The OpenAI routes that generate text, and everything that differs between them.

One row per endpoint decides how its request body is parsed, how its streamed chunks are read,
where its generated text sits (for the safety policy) and where it goes upstream; handlers,
the Codec plan and the policed JSON path read the row instead of passing each choice along.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from proxy.core.http.request import (
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)
from proxy.core.http.upstream_body import Endpoint as EndpointName
from proxy.core.safety.json_policing import (
    CHAT_DELTA,
    CHAT_MESSAGE,
    COMPLETION_TEXT,
    TextField,
)
from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.transcode import ChunkParser
from proxy.core.wire.prompt_ids import PromptLimits


@dataclass(frozen=True)
class Endpoint:
    name: EndpointName
    # Where Codec requests without a path of their own (Path B) are sent upstream.
    upstream_path: str
    # The request body, validated for Codec (the limits bound token-ID prompts).
    parse_request: Callable[[bytes, PromptLimits], CompletionRequest]
    parse_chunk: ChunkParser
    # Where the generated text is in a streamed chunk and in a whole response body.
    streamed_text: TextField
    body_text: TextField


COMPLETIONS: Final = Endpoint(
    "completions",
    "/v1/completions",
    parse_completion_request,
    parse_completion_chunk,
    COMPLETION_TEXT,
    COMPLETION_TEXT,
)
# codec-spec.md §3.2: chat is an engine extension; the template stays on the backend.
CHAT: Final = Endpoint(
    "chat",
    "/v1/chat/completions",
    lambda raw, limits: parse_chat_request(raw),
    parse_chat_chunk,
    CHAT_DELTA,
    CHAT_MESSAGE,
)
