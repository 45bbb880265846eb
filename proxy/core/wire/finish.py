"""`finish_reason` between OpenAI's words and the Codec vocabulary (codec-spec.md §2).

The spec enum is open (`length`, `eos_token`, `stop_sequence`, `error`, `policy_violation`);
engines pass their own words through (`stop`, `abort`, ...). Clients treat values they do not
know as `error`, so we only ever send spec words; and reading a stream back to OpenAI JSON
(proxy/core/render/), that is what we do with them.
"""

from __future__ import annotations

LENGTH = "length"
EOS_TOKEN = "eos_token"
STOP_SEQUENCE = "stop_sequence"
ERROR = "error"
POLICY_VIOLATION = "policy_violation"
# Not in the spec's list: the Codec website's word for a turn that ended in tool calls
# (codec-spec.md §2, "Values seen elsewhere"). Sent only on streams whose frames carried
# `tool_calls` (proxy/core/stream/transcode.py); a client that does not know it treats it as error.
TOOL_CALL = "tool_call"


def codec_finish_reason(finish_reason: str, stop_reason: str | int | None = None) -> str:
    """The Codec word for an upstream stream's end.

    `stop` means end-of-sequence unless the backend says a stop string or stop token matched:
    vLLM names it in `stop_reason`; llama.cpp's OpenAI mode does not say, so a stop-string hit
    behind llama.cpp reports `eos_token`.
    """
    match finish_reason:
        case "length":
            return LENGTH
        case "stop":
            return EOS_TOKEN if stop_reason is None else STOP_SEQUENCE
        # llama.cpp's native words, in case a backend passes them through.
        case "eos_token" | "stop_sequence":
            return finish_reason
        case "content_filter":
            return POLICY_VIOLATION
        case "tool_calls" | "function_call":
            # Without calls on the frames (none could be parsed) the turn simply ended.
            return EOS_TOKEN
        case _:
            return ERROR


# OpenAI's words (the `finish_reason` of a chunk or a choice).
OPENAI_LENGTH = "length"
OPENAI_STOP = "stop"
OPENAI_CONTENT_FILTER = "content_filter"
OPENAI_TOOL_CALLS = "tool_calls"


def openai_finish_reason(reason: str | None, *, chat: bool) -> str | None:
    """The OpenAI word for a Codec stream's end, the other way from `codec_finish_reason`.

    None for `error` and for any word this table does not know: the spec's rule for unknown
    values of the open enum is to treat them as `error` (codec-spec.md §2). `stop` is what the
    engine forks send for both end-of-sequence and a stop string (interop.md §0.6). A turn that
    ended in tool calls is `tool_calls` in a chat; a completion has no calls, so it stopped.
    """
    match reason:
        case "length":
            return OPENAI_LENGTH
        case "eos_token" | "stop_sequence" | "stop":
            return OPENAI_STOP
        case "policy_violation":
            return OPENAI_CONTENT_FILTER
        case "tool_call":
            return OPENAI_TOOL_CALLS if chat else OPENAI_STOP
        case _:
            return None
