"""What a traced request's server span and its upstream attempts' client spans are told.

The interface the edge calls (telemetry/worker_tracer.py holds a worker's tracer while traces
are on, telemetry/otel_spans.py makes the spans): kept apart from both, so that a module that
only passes a trace on imports nothing of OpenTelemetry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Final, Protocol

from aiohttp import web

from proxy.core.stream.transcode import StreamOutcome
from proxy.server.telemetry.record import RequestRecord

# The W3C Trace Context Level 2 draft's response header: the server span's context, so a caller
# can find the trace of a response it got.
TRACERESPONSE_HEADER: Final = "traceresponse"


class Origin(Protocol):
    """Where an upstream request goes (the data plane's `Origin`)."""

    @property
    def scheme(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def host_header(self) -> str: ...
    @property
    def base_path(self) -> str: ...


class UpstreamAttempt(ABC):
    """The client span of one request sent to one upstream."""

    # The trace context it sends upstream (`traceparent`, and `tracestate` when there is one),
    # in place of any the caller sent.
    fields: tuple[tuple[str, str], ...]

    @abstractmethod
    def answered(self, status: int) -> None:
        """The upstream's response head is in."""

    @abstractmethod
    def failed(self, error: BaseException) -> None:
        """The attempt failed before a response head (it is retried, or the request fails)."""

    @abstractmethod
    def ended(self) -> None:
        """The exchange is over."""


class RequestTrace(ABC):
    """One traced request: its server span, and the client spans of its upstream attempts."""

    trace_id: str  # 32 hex digits: in the access log
    response_header: str  # the `traceresponse` value

    @abstractmethod
    def attempt(self, method: str, origin: Origin, path_qs: str, resend: int) -> UpstreamAttempt:
        """Open the client span of an upstream request; `resend`: attempts before this one."""

    @abstractmethod
    def generation(self, operation: str, model: str | None) -> None:
        """A generation route: the GenAI operation and the model the request names."""

    @abstractmethod
    def refused(self, reason: str) -> None:
        """A Codec request was refused (its reason, the metric's label)."""

    @abstractmethod
    def error(self, code: str) -> None:
        """The request was answered with an error of this code."""

    @abstractmethod
    def codec_stream(
        self, outcome: StreamOutcome | None, token_source: str, verification: str | None
    ) -> None:
        """A Codec stream ended: how, where its IDs came from, and its verification verdict
        (None: not sampled)."""

    @abstractmethod
    def end(self, record: RequestRecord) -> None:
        """The response is over: the server span takes what the record says and ends."""


TRACE = web.RequestKey[RequestTrace]("trace")


def echo_trace(request: web.Request, response: web.StreamResponse) -> None:
    """As a response is prepared (with tracing on): the response names its trace."""
    trace = request.get(TRACE)
    if trace is not None:
        response.headers[TRACERESPONSE_HEADER] = trace.response_header
