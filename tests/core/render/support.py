"""Real captured upstream streams turned into Codec frames by the proxy's own transcoder."""

from __future__ import annotations

import itertools
import json
from typing import Any

from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.token_source import TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.frames import Frame
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import load_capture

# Every captured generation stream (tests/fixtures/upstream/README.md), llama.cpp's and vLLM's.
STREAM_CAPTURES = (
    "llamacpp-chat-emoji-logprobs.txt",
    "llamacpp-chat-sample.txt",
    "llamacpp-chat-usage.txt",
    "llamacpp-completions-cut-utf8-logprobs.txt",
    "llamacpp-completions-emoji-logprobs.txt",
    "llamacpp-completions-eos-logprobs.txt",
    "llamacpp-completions-logprobs.txt",
    "llamacpp-completions-sample-with-headers.txt",
    "llamacpp-completions-sample.txt",
    "llamacpp-completions-stop-holdback-logprobs.txt",
    "llamacpp-completions-stop-logprobs.txt",
    "vllm-chat-reasoning-synthetic.txt",
    "vllm-chat-tool-calls-synthetic.txt",
    "vllm-chat.txt",
    "vllm-completions-sample.txt",
    "vllm-completions-stop-sequence.txt",
    "vllm-completions-token-ids.txt",
)
TOOL_CALLS = "vllm-chat-tool-calls-synthetic.txt"


def reports_ids(name: str) -> bool:
    """Whether the capture carries the backend's IDs (llama.cpp `logprobs`, vLLM `token_ids`)."""
    return any(mark in name for mark in ("-logprobs", "-token-ids", "-synthetic"))


def is_chat(name: str) -> bool:
    return "-chat" in name


def upstream_chunks(name: str) -> list[dict[str, Any]]:
    """The capture's JSON chunks, as an OpenAI client parses them."""
    chunks = []
    for event in load_capture(name).events:
        data = event.decode().removeprefix("data: ").strip()
        if data != "[DONE]":
            chunks.append(json.loads(data))
    return chunks


def upstream_text(name: str) -> str:
    return load_capture(name).stream_text(chat=is_chat(name))


def upstream_finish(name: str) -> str:
    reasons = [
        choice["finish_reason"]
        for chunk in upstream_chunks(name)
        for choice in chunk.get("choices") or []
        if choice.get("finish_reason")
    ]
    return str(reasons[-1])


def transcoded(vocabulary: Vocabulary, name: str, mode: TokenIdMode) -> list[list[Frame]]:
    """The frames the proxy makes of the capture, one list per upstream event as it arrives."""
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if is_chat(name) else parse_completion_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )
    frames = [transcoder.feed(event) for event in load_capture(name).events]
    frames.append(transcoder.flush())
    assert transcoder.outcome is not None
    return [batch for batch in frames if batch]


def transcoded_reads(
    vocabulary: Vocabulary, name: str, mode: TokenIdMode, cuts: list[int]
) -> list[list[Frame]]:
    """The frames the proxy makes of the capture's body cut into reads at byte offsets `cuts`
    (a proxy that falls behind reads many events at once, and reads end anywhere)."""
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if is_chat(name) else parse_completion_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )
    body = load_capture(name).body
    edges = [0, *sorted({min(cut, len(body)) for cut in cuts}), len(body)]
    frames = [transcoder.feed(body[start:end]) for start, end in itertools.pairwise(edges)]
    frames.append(transcoder.flush())
    assert transcoder.outcome is not None
    return [batch for batch in frames if batch]


def source_of(vocabulary: Vocabulary, name: str, mode: TokenIdMode) -> str:
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if is_chat(name) else parse_completion_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )
    for event in load_capture(name).events:
        transcoder.feed(event)
    transcoder.flush()
    assert transcoder.outcome is not None
    return transcoder.outcome.token_source
