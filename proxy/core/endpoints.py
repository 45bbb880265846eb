"""The OpenAI routes that generate text, and everything that differs between them.

One row per endpoint decides how its request body is parsed, how its streamed chunks are read,
where its generated text sits (for the safety policy) and where it goes upstream; handlers,
the Codec plan and the policed JSON path read the row instead of passing each choice along.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from proxy.core.http.request import (
    CompletionRequest,
    LimitsFor,
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


@dataclass(frozen=True)
class Endpoint:
    name: EndpointName
    # Where Codec requests without a path of their own (Path B) are sent upstream.
    upstream_path: str
    # Every path the backends serve this endpoint on (llama.cpp also answers without `/v1`).
    paths: tuple[str, ...]
    # The request body, validated for Codec (the limits bound token-ID prompts).
    parse_request: Callable[[bytes, LimitsFor], CompletionRequest]
    parse_chunk: ChunkParser
    # Where the generated text is in a streamed chunk and in a whole response body.
    streamed_text: TextField
    body_text: TextField


COMPLETIONS: Final = Endpoint(
    "completions",
    "/v1/completions",
    ("/v1/completions", "/completions"),
    parse_completion_request,
    parse_completion_chunk,
    COMPLETION_TEXT,
    COMPLETION_TEXT,
)
# codec-spec.md §3.2: chat is an engine extension; the template stays on the backend.
CHAT: Final = Endpoint(
    "chat",
    "/v1/chat/completions",
    ("/v1/chat/completions", "/chat/completions"),
    lambda raw, limits: parse_chat_request(raw),
    parse_chat_chunk,
    CHAT_DELTA,
    CHAT_MESSAGE,
)
ENDPOINTS: Final = (COMPLETIONS, CHAT)
# Path B (codec-spec.md §3.3): a binary `CodecRequest`, answered with completions' frames.
CODEC_REQUEST_PATH: Final = "/v1/completions/codec"

# Routes of the backends we front (llama.cpp, vLLM, SGLang) that generate text in shapes the
# safety policy does not read: with a policy loaded they are refused, not relayed unchecked.
UNPOLICED_GENERATION_PATHS: Final = frozenset(
    {
        "/completion",  # llama.cpp native
        "/infill",  # llama.cpp
        "/v1/messages",  # llama.cpp, Anthropic's shape
        "/v1/responses",  # vLLM, SGLang
        "/generate",  # SGLang native, vLLM's demo server
        "/invocations",  # vLLM's SageMaker entry point
    }
)


def canonical_path(raw_path: str) -> str:
    """A request path as a backend's router is likely to read it: percent-decoded, dot
    segments resolved, repeated and trailing slashes dropped, lowercase. Only used to decide
    what a path means (which generation route, what the safety policy can read), never to
    rewrite what is sent upstream."""
    path = posixpath.normpath("/" + unquote(raw_path).split("?", 1)[0])
    return "/" + path.strip("/").lower()


def endpoint_for(raw_path: str) -> Endpoint | None:
    """The endpoint a path is an alias of, however it is spelled."""
    path = canonical_path(raw_path)
    return next((endpoint for endpoint in ENDPOINTS if path in endpoint.paths), None)


def is_codec_request(raw_path: str) -> bool:
    """Whether a path is Path B's, however it is spelled."""
    return canonical_path(raw_path) == CODEC_REQUEST_PATH


def generates_unpoliced_text(raw_path: str) -> bool:
    return canonical_path(raw_path) in UNPOLICED_GENERATION_PATHS
