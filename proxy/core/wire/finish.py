"""Map an OpenAI `finish_reason` to the Codec vocabulary (codec-spec.md §2).

The spec enum is open (`length`, `eos_token`, `stop_sequence`, `error`, `policy_violation`);
engines pass their own words through (`stop`, `abort`, ...). Clients treat values they do not
know as `error`, so we only ever send spec words.
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
