"""Which requests a client of a Codec server asks Codec for, how, and which refusals mean
"repeat it as JSON". Two such clients share it: the OpenAI SDK transport (proxy/sdk/) and
codec-proxy itself in front of a Codec server (`upstream_protocol = "codec"`,
proxy/server/control/codec_upstream.py); answer.py reads what comes back.

A request is asked as Codec only when every byte of what the OpenAI client expects can come
back from frames; anything else passes through untouched (docs/CLIENTS.md):

* only `POST .../completions` and `POST .../chat/completions` with `stream: true`, or, for a
  caller that renders the whole answer too (`whole=True`: the proxy, whose long hop is worth
  it), without; the SDK transport leaves non-streamed requests alone (a non-streamed answer
  costs JSON only once, and Codec would buy it little on a client's own link);
* one choice (`n`, `best_of` 1): a frame has no choice index (codec-spec.md §2);
* no log probabilities (`logprobs`, `top_logprobs`) and no `echo`: frames carry IDs only;
* a completion's `prompt` is one string or one token-ID array (the proxy refuses batches);
* a chat answer in text only: `audio` or a `modalities` other than `["text"]` passes through;
* and no `stream_format` already: the caller asked for something itself.

What comes back decides the rest. docs/ROLLOUT.md says what a client does when Codec is
refused: 403 `codec_not_enabled` → the same request without `stream_format`, and no Codec for
a while; 426 → no upgrade would help this transport, so the same; 503 `tokenizer_mismatch` or
`verification_mismatch` → JSON until the `Retry-After` the proxy names. A Path B 404 never
arises: the transport speaks Path A only, which is what the SDK's requests are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from proxy.core.http.access import CODEC_NOT_ENABLED
from proxy.core.render.turn import TextRules
from proxy.core.wire.formats import MEDIA_TYPES

__all__ = [
    "CLIENT_VERSION",
    "DEFAULT_REMEMBER_SECONDS",
    "REFUSAL_STATUSES",
    "CodecAsk",
    "Fallback",
    "RefusalMemory",
    "codec_ask",
    "codec_ask_for",
    "codec_headers",
    "fallback_for",
]

# The Codec version this client speaks: v0.5's frames, headers and dictionary discovery, the
# v0.4 `policy_violation` finish reason (rendered as `content_filter`). A stated version is
# also what lets the proxy send dictionary zstd (proxy/core/http/content_coding.py).
CLIENT_VERSION: Final = "0.5"

Endpoint = Literal["completions", "chat"]

# How long a refusal that names no time of its own keeps this client on JSON.
DEFAULT_REMEMBER_SECONDS: Final = 300.0
# The refusals of Codec a client answers by asking again as JSON (docs/ROLLOUT.md), by status:
# the error codes that mean one (None: any error of that status), and whether `Retry-After`
# says for how long. 403 `codec_not_enabled`: the rollout switches; 426: a version floor no
# upgrade of this client would meet; 503: the proxy's tokenizer drift check or verification
# refuses Codec for the model while JSON is served.
_REFUSALS: Final[Mapping[int, tuple[frozenset[str] | None, bool]]] = {
    403: (frozenset({CODEC_NOT_ENABLED}), False),
    426: (None, False),
    503: (frozenset({"tokenizer_mismatch", "verification_mismatch"}), True),
}
# The statuses whose body says whether they are one; any other error is the API's own answer.
REFUSAL_STATUSES: Final = frozenset(_REFUSALS)


def codec_headers(stream_format: str, accept_encoding: str) -> tuple[tuple[str, str], ...]:
    """The headers that ask for Codec: the format's media type, the codings this client
    decodes, the version it speaks."""
    return (
        ("Accept", MEDIA_TYPES[stream_format]),
        ("Accept-Encoding", accept_encoding),
        ("Codec-Client-Version", CLIENT_VERSION),
    )


@dataclass(frozen=True, slots=True)
class CodecAsk:
    """A request to send as Codec, and what rendering its answer needs to know of it."""

    endpoint: Endpoint
    body: bytes  # the same JSON with `stream_format` added
    model: str
    rules: TextRules  # the request's stop strings
    include_usage: bool
    # The client asked for a stream (`stream: true`); else it gets the whole answer, which the
    # Codec request still asks as a stream (frames are a stream).
    streamed: bool = True


def _endpoint(method: str, path: str) -> Endpoint | None:
    if method != "POST":
        return None
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    return None


def _one(value: Any) -> bool:
    return value is None or value == 1


def _stops(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(stop for stop in value if isinstance(stop, str))
    return ()


def codec_ask(
    method: str, path: str, body: bytes, *, stream_format: str, whole: bool = False
) -> CodecAsk | str:
    """The Codec form of a request, or why it passes through untouched."""
    endpoint = _endpoint(method, path)
    if endpoint is None:
        return "not a generation request"
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "not a JSON body"
    if not isinstance(document, dict):
        return "not a JSON object"
    return codec_ask_for(endpoint, document, stream_format=stream_format, whole=whole)


def codec_ask_for(
    endpoint: Endpoint, document: Mapping[str, Any], *, stream_format: str, whole: bool = False
) -> CodecAsk | str:
    """`codec_ask` for a body already parsed (`document` is not changed)."""
    streamed = document.get("stream") is True
    if not (streamed or (whole and document.get("stream") in (None, False))):
        return "not streamed"
    if "stream_format" in document:
        return "stream_format already chosen"
    if not (_one(document.get("n")) and _one(document.get("best_of"))):
        return "more than one choice"
    if endpoint == "completions":
        if document.get("logprobs") is not None or document.get("echo"):
            return "logprobs or echo"
        prompt = document.get("prompt")
        one_prompt = isinstance(prompt, str) or (
            isinstance(prompt, list) and all(type(item) is int for item in prompt)
        )
        if not one_prompt:
            return "not one prompt"
    else:
        if document.get("logprobs") or document.get("top_logprobs") is not None:
            return "logprobs"
        modalities = document.get("modalities")
        if document.get("audio") is not None or modalities not in (None, ["text"]):
            return "not text only"
    model = document.get("model")
    options = document.get("stream_options")
    include_usage = streamed and isinstance(options, dict) and options.get("include_usage") is True
    # vLLM's `include_stop_str_in_output`: the backend keeps the stop string, so do we.
    keep_stop = document.get("include_stop_str_in_output") is True
    asked = {**document, "stream": True, "stream_format": stream_format}
    return CodecAsk(
        endpoint,
        orjson.dumps(asked),
        model if isinstance(model, str) else "",
        TextRules(stop=() if keep_stop else _stops(document.get("stop"))),
        include_usage,
        streamed,
    )


@dataclass(frozen=True, slots=True)
class Fallback:
    """Repeat the request as JSON; ask no Codec of this origin and model for `seconds`."""

    reason: str
    seconds: float


def _error_code(body: bytes) -> str | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        return code if isinstance(code, str) else None
    # The 426 body names its error at the top (codec-spec.md §6).
    return error if isinstance(error, str) else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def fallback_for(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    remember_seconds: float = DEFAULT_REMEMBER_SECONDS,
) -> Fallback | None:
    """Whether an error answer to a Codec request means "ask again as JSON" (`_REFUSALS`).

    `headers` case-insensitive (httpx's, aiohttp's), or with lowercase names; `body` decoded.
    Any other error is the API's own answer, and the client gets it as it is: JSON would have
    met it too.
    """
    rule = _REFUSALS.get(status)
    if rule is None:
        return None
    codes, timed = rule
    code = _error_code(body)
    if codes is not None and code not in codes:
        return None
    seconds = _retry_after(headers) if timed else None
    # The 426 body names its error at the top, the proxy's `codec_version_required`.
    reason = code or "codec_version_required"
    return Fallback(reason, remember_seconds if seconds is None else seconds)


class RefusalMemory:
    """Where Codec was refused, until when. Keys are the caller's (origin and model); time is
    passed in."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[tuple[str, str], float] = {}

    def remember(self, key: tuple[str, str], now: float, seconds: float) -> None:
        self._until[key] = now + seconds

    def refused(self, key: tuple[str, str], now: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if now >= until:
            self._until.pop(key, None)
            return False
        return True
