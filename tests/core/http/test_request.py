"""Path A request validation: token-ID prompts bounded by `max_prompt_ids` (413) before their IDs
are parsed, and JSON the backend must never see refused as `invalid_json` (400)."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.errors import BadRequest, PayloadTooLarge
from proxy.core.http.request import parse_chat_request, parse_completion_request
from proxy.core.wire.prompt_ids import PromptLimits

VOCAB = 49152
# Long enough for the sliced path of the JSON parser (64 KiB of IDs).
LONG = [(i * 7919) % VOCAB for i in range(20_000)]


def completion(prompt: object, **fields: object) -> bytes:
    body = {"stream_format": "msgpack", "prompt": prompt, **fields}
    return orjson.dumps(body)


@pytest.mark.parametrize(
    ("prompt", "limit"),
    [([1, 2, 3, 4], 3), ([[1, 2, 3, 4]], 3), (LONG, len(LONG) - 1), ([LONG], len(LONG) - 1)],
    ids=["short", "short-batch-of-one", "long", "long-batch-of-one"],
)
def test_a_token_id_prompt_over_the_limit_is_a_413(prompt: object, limit: int) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        parse_completion_request(completion(prompt), PromptLimits(VOCAB, limit))
    assert (info.value.status_hint, info.value.code) == (413, "prompt_too_long")


def test_a_prompt_at_the_limit_is_fine() -> None:
    parsed = parse_completion_request(completion(LONG), PromptLimits(VOCAB, len(LONG)))
    assert parsed.body["prompt"] == LONG


def test_a_long_prompt_is_refused_by_its_count_before_any_id_is_parsed() -> None:
    # A malformed element deep inside: the count alone decides, no ID is looked at.
    raw = completion(LONG).replace(b",7919,", b",07919,", 1)
    with pytest.raises(PayloadTooLarge):
        parse_completion_request(raw, PromptLimits(VOCAB, 100))
    with pytest.raises(BadRequest) as info:  # within the limit it is parsed, and refused
        parse_completion_request(raw, PromptLimits(VOCAB, len(LONG)))
    assert info.value.code == "invalid_json"


def test_long_ids_outside_the_vocabulary_or_not_ints_are_found() -> None:
    limits = PromptLimits(VOCAB, len(LONG))
    for bad, code in ((VOCAB, "invalid_token_id"), (-1, "invalid_token_id"), (1.5, "invalid_type")):
        with pytest.raises(BadRequest) as info:
            parse_completion_request(completion([*LONG[:-1], bad]), limits)
        assert info.value.code == code


def test_json_requests_and_text_prompts_are_not_counted() -> None:
    limits = PromptLimits(VOCAB, 3)
    passthrough = parse_completion_request(completion(LONG, stream_format="json"), limits)
    assert passthrough.body["prompt"] == LONG  # parsed whole, for the relay
    assert parse_completion_request(completion("word " * 10_000), limits).is_codec


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "\\ud800", "stream_format": "msgpack"}',
        b'{"prompt": "x", "stream_format": "msgpack", "user": "\\udfff"}',
        b'{"stream_format": "msgpack", "prompt": "x", "a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
    ids=["prompt", "any-field", "deep"],
)
def test_lone_surrogates_and_deep_nesting_are_invalid_json(raw: bytes) -> None:
    with pytest.raises(BadRequest) as completion:
        parse_completion_request(raw, PromptLimits(VOCAB, 10))
    with pytest.raises(BadRequest) as chat:
        parse_chat_request(raw)
    for info in (completion, chat):
        assert (info.value.status_hint, info.value.code) == (400, "invalid_json")
