"""Validate an OpenAI completion or chat request and decide whether it asks for Codec.

Everything is checked before the upstream is contacted (codec-spec.md §12 items 10–13, 37): a
request the proxy cannot serve as Codec gets a 400 that says why, never a half-written stream.
JSON requests are only checked as far as routing needs; the backend validates the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from proxy.core.errors import BadRequest
from proxy.core.http.json_body import parse_json_object, read_json_object
from proxy.core.http.upstream_body import Endpoint, UpstreamRequest
from proxy.core.wire.formats import JSON, check_stream_format
from proxy.core.wire.prompt_ids import PromptLimits, item_types, outside_vocabulary

# The prompt limits, or how to find them from the request's fields: they are the model's (its
# vocabulary and context), and the model is named in the body being parsed.
LimitsFor: TypeAlias = PromptLimits | Callable[[Mapping[str, Any]], PromptLimits]


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed request body, the endpoint it came to, and the stream format it asked for."""

    body: dict[str, Any]
    stream_format: str
    endpoint: Endpoint = "completions"

    @property
    def is_codec(self) -> bool:
        return self.stream_format != JSON

    def upstream(self) -> UpstreamRequest:
        """What a plain OpenAI backend is asked for a Codec request: `stream_format` is ours,
        the backend never sees it (the model and token-ID fields are decided later)."""
        fields = {k: v for k, v in self.body.items() if k != "stream_format"}
        return UpstreamRequest(self.endpoint, fields)


def parse_completion_request(raw: bytes, limits_for: LimitsFor) -> CompletionRequest:
    """Parse a `/v1/completions` body; `BadRequest` for what a Codec stream can't carry."""
    document = read_json_object(raw)
    body = document.value
    stream_format = check_stream_format(body.get("stream_format", JSON))
    request = CompletionRequest(body, stream_format)
    limits: PromptLimits | None = None
    if request.is_codec:
        # Known before a prompt ID is parsed: an unknown model is refused before that work.
        limits = limits_for if isinstance(limits_for, PromptLimits) else limits_for(body)
        _check_sampling(body, stream_format)
        _optional(body, "best_of", int, must_be_one=stream_format)
        if _optional(body, "echo", bool):
            raise BadRequest(
                f"echo is not supported with stream_format={stream_format!r}", code="unsupported"
            )
        pending, prompt = document.pending, body.get("prompt")
        if pending is not None and (pending.items is prompt or pending.items is _single(prompt)):
            # Counted from the body's bytes: too many IDs are refused before any is parsed.
            limits.check_count(pending.count)
    document.complete()
    if limits is not None and request.is_codec:
        check_prompt(body.get("prompt"), limits, stream_format)
    return request


def parse_chat_request(raw: bytes) -> CompletionRequest:
    """Parse a `/v1/chat/completions` body (codec-spec.md §3.2: an engine extension).

    The chat template stays on the backend: `messages` go up unchanged, only the generated
    tokens come back, so roles never reach the wire.
    """
    body = parse_json_object(raw)
    stream_format = check_stream_format(body.get("stream_format", JSON))
    request = CompletionRequest(body, stream_format, "chat")
    if request.is_codec:
        _check_sampling(body, stream_format)
        _optional(body, "max_completion_tokens", int)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", code="invalid_type")
    return request


def _check_sampling(body: dict[str, Any], fmt: str) -> None:
    # A Codec frame carries no choice index, so several choices cannot be told apart
    # (codec-spec.md §2: servers MUST reject n > 1; batches are the same problem, §11.24).
    _optional(body, "n", int, must_be_one=fmt)
    _optional(body, "max_tokens", int)
    _optional(body, "temperature", (int, float))
    _optional(body, "stream", bool)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise BadRequest("stop must be a string or a list of strings", code="invalid_type")


def _single(prompt: Any) -> Any:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]  # a batch of one is a single prompt
    return prompt


def check_prompt(prompt: Any, limits: PromptLimits, fmt: str) -> None:
    """A single prompt: a string, or a list of at most `limits.max_ids` token IDs inside the
    vocabulary. A string is not counted: the body limit bounds it, and the backend tokenizes."""
    prompt = _single(prompt)
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest(
            "prompt must be a string or a non-empty list of token IDs", code="invalid_type"
        )
    types = item_types(prompt)
    if str in types or list in types:
        raise BadRequest(
            f"a batch of prompts cannot be streamed as stream_format={fmt!r}: "
            "a Codec frame has no choice index; send one prompt per request",
            code="unsupported_batch",
        )
    if types != {int}:  # bool is a type of its own here, as JSON has it
        raise BadRequest("prompt token IDs must be integers", code="invalid_type")
    limits.check_count(len(prompt))
    token_id = outside_vocabulary(prompt, limits.vocab_size)
    if token_id is not None:
        raise BadRequest(
            f"prompt token ID {token_id} is outside the vocabulary [0, {limits.vocab_size})",
            code="invalid_token_id",
        )


def _optional(
    body: dict[str, Any],
    field: str,
    kind: type | tuple[type, ...],
    *,
    must_be_one: str | None = None,
) -> Any:
    value = body.get(field)
    if value is None:
        return None
    wrong_bool = isinstance(value, bool) and kind is not bool
    if wrong_bool or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"{field} must be of type {names}", code="invalid_type")
    if must_be_one is not None and value != 1:
        raise BadRequest(
            f"stream_format={must_be_one!r} requires {field}=1: a Codec frame has no choice index",
            code="unsupported_n",
        )
    return value
