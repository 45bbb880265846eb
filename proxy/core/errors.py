"""One small error tree. Every error carries the HTTP status the edge should answer with.

Foreign exceptions (JSON, msgpack, protobuf, zlib, ...) are translated into these exactly once,
where they are caught, with `raise ... from exc`.
"""

from __future__ import annotations


class ProxyError(Exception):
    """Root of every error codec-proxy raises on purpose. Not raised directly."""

    status_hint: int = 500
    error_type: str = "server_error"
    # What a client is told instead of `message` when the message is for the operator only
    # (it may name upstream URLs or foreign exception text); None: the message is the client's.
    public_message: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        public: bool = False,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        # The request field at fault, as OpenAI's errors name it (`"param": "model"`).
        self.param = param
        if public:  # this message was written for clients: it replaces the class's generic one
            self.public_message = message


class BadRequest(ProxyError):
    """The client's request is malformed or asks for something we refuse (400)."""

    status_hint = 400
    error_type = "invalid_request_error"


class Forbidden(BadRequest):
    """The request is understood and refused by this deployment's policy (403)."""

    status_hint = 403


class NotFound(BadRequest):
    """What the request names does not exist here, e.g. a model no entry serves (404)."""

    status_hint = 404


class PayloadTooLarge(BadRequest):
    """A request body, decompressed or not, is over the configured limit (413)."""

    status_hint = 413


class UnsupportedMediaType(BadRequest):
    """A request body has a content type or content coding we do not accept (415)."""

    status_hint = 415


class NotAcceptable(BadRequest):
    """No response representation the client accepts can be produced (406)."""

    status_hint = 406


class UpstreamProtocolError(ProxyError):
    """The upstream sent bytes that break the SSE or OpenAI chunk grammar (502)."""

    status_hint = 502
    error_type = "upstream_error"
    public_message = "the upstream's response could not be used"


class EventTooLarge(UpstreamProtocolError):
    """One SSE event from the upstream exceeded the configured maximum size (502)."""


class UpstreamUnavailable(ProxyError):
    """The upstream could not be reached or dropped the connection before answering (502)."""

    status_hint = 502
    error_type = "upstream_error"
    public_message = "the upstream could not be reached or failed before answering"


class UpstreamTimeout(ProxyError):
    """The upstream did not answer in time (504)."""

    status_hint = 504
    error_type = "upstream_timeout"
    public_message = "the upstream did not answer in time"


class ConfigError(ProxyError):
    """The proxy's own configuration is unusable; refused at start-up, never mid-request."""

    error_type = "config_error"


class UpgradeRequired(ProxyError):
    """The client's Codec version is below what this deployment enforces (426).

    Carries the complete response (codec-spec.md §6, "426 response"), built by
    `proxy.core.http.upgrade`, because clients parse its exact body and headers.
    """

    status_hint = 426
    error_type = "codec_version_required"

    def __init__(self, message: str, *, headers: tuple[tuple[str, str], ...], body: bytes) -> None:
        super().__init__(message, code="codec_version_required")
        self.headers = headers
        self.body = body


class ServiceUnavailable(ProxyError):
    """The proxy refuses this kind of request for now, e.g. Codec mode while its tokenizer
    does not match the backend's (503). `code` names the condition; `retry_after`, in
    seconds, says when asking again may be answered otherwise (`Retry-After`)."""

    status_hint = 503
    error_type = "service_unavailable"

    def __init__(self, message: str, *, code: str, retry_after: int | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class TokenizerMapError(ProxyError):
    """A tokenizer map cannot be generated, parsed or published as asked (500).

    Raised at start-up (a configuration problem) and by `codec-proxy map`; the message is one
    line that names the problem.
    """
