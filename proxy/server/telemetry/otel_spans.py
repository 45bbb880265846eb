"""The spans, made with the OpenTelemetry SDK: imported only when tracing is on (worker_tracer.py).

Spans are handed to a `BatchSpanProcessor`, whose own thread encodes and exports them over
OTLP/HTTP: ending a span only queues it, and exporting never waits on the event loop (or the
loop on the collector). Nothing here touches the current context (`contextvars`): each span is
given its parent, so a request's trace cannot leak into another's.

Attribute names follow the OpenTelemetry semantic conventions, HTTP (`http.*`, `url.*`,
`server.*`, `error.type`) and GenAI (`gen_ai.*`), and Codec's own are under `codec.`. Values
come from what the request already accounted (its `RequestRecord`, the Codec stream's outcome),
and are given to a span once, at its end: each call into a span takes its lock and checks every
value again.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from proxy import __version__
from proxy.core.stream.transcode import StreamOutcome
from proxy.server.telemetry.record import RequestRecord
from proxy.server.telemetry.request_trace import Origin, RequestTrace, UpstreamAttempt

# W3C Trace Context: `traceparent` read from the caller, written to the upstream.
_PROPAGATOR: Final = TraceContextTextMapPropagator()
# No parent: a span started with it is the root of a new trace.
_NEW_TRACE: Final = Context()
_ERROR: Final = Status(StatusCode.ERROR)
# Methods the HTTP conventions name; any other is `_OTHER` (a client's token, unbounded).
_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
# A path is the client's: bounded like any value the proxy did not choose.
_PATH_CHARS: Final = 256
_MODEL_CHARS: Final = 256
# Route names of the access log that are no route template (control/observe.py).
_NO_TEMPLATE: Final = frozenset({"relay", "unmatched"})
# Outcomes that are not failures of the proxy or its upstream.
_NOT_FAILED: Final = frozenset({"ok", "client_disconnect", "slow_client", "policy_stop"})

Attributes = dict[str, AttributeValue]


class OtelTracer:
    """A worker's tracer provider, its exporter and batching thread."""

    def __init__(self, endpoint: str, *, trust_callers: bool) -> None:
        # Off: a caller's trace context is only a link (OpenTelemetry's "public endpoint").
        self._trust_callers = trust_callers
        # The standard variables (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) win over ours.
        detected = OTELResourceDetector().detect().attributes
        resource = Resource.create(
            {"service.name": "codec-proxy", "service.version": __version__, **detected}
        )
        # Shut down by the app's cleanup, not at exit: the flush must happen within the drain.
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer = self._provider.get_tracer("codec-proxy", __version__)

    def begin(self, request: web.Request, route: str) -> RequestTrace:
        method = _method(request.method)
        attributes: Attributes = {
            "http.request.method": method,
            "url.scheme": request.scheme,
            "url.path": request.path[:_PATH_CHARS],
        }
        if request.method != method:
            attributes["http.request.method_original"] = request.method[:_PATH_CHARS]
        name = method
        if route not in _NO_TEMPLATE:
            attributes["http.route"] = route
            name = f"{method} {route}"
        caller = _PROPAGATOR.extract(request.headers)
        links: tuple[Link, ...] = ()
        if self._trust_callers:
            parent = caller
        else:
            parent, links = _NEW_TRACE, _link_to(caller)
        span = self._tracer.start_span(name, parent, SpanKind.SERVER, attributes, links)
        return _RequestTrace(self._tracer, span)

    def shutdown(self) -> None:
        """Export what is queued, then stop the batching thread (blocking)."""
        self._provider.shutdown()


class _RequestTrace(RequestTrace):
    def __init__(self, tracer: trace_api.Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context = trace_api.set_span_in_context(span)
        self._operation: str | None = None
        self._model: str | None = None
        self._error: str | None = None
        self._attributes: Attributes = {}  # told before the end, given to the span with it
        context = span.get_span_context()
        self.trace_id = trace_api.format_trace_id(context.trace_id)
        span_id = trace_api.format_span_id(context.span_id)
        self.response_header = f"00-{self.trace_id}-{span_id}-{context.trace_flags:02x}"

    def attempt(self, method: str, origin: Origin, path_qs: str, resend: int) -> UpstreamAttempt:
        path = origin.base_path + path_qs.partition("?")[0]  # a query may hold what is private
        attributes: Attributes = {
            "http.request.method": _method(method),
            "server.address": origin.host,
            "server.port": origin.port,
            "url.full": f"{origin.scheme}://{origin.host_header}{path[:_PATH_CHARS]}",
        }
        if resend:
            attributes["http.request.resend_count"] = resend
        name = _method(method)
        if self._operation is not None:
            # The GenAI conventions' inference span: "{operation} {model}".
            attributes["gen_ai.operation.name"] = self._operation
            name = self._operation
            if self._model is not None:
                attributes["gen_ai.request.model"] = self._model
                name = f"{name} {self._model}"
        span = self._tracer.start_span(name, self._context, SpanKind.CLIENT, attributes)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace_api.set_span_in_context(span))
        return _Attempt(span, tuple(carrier.items()))

    def generation(self, operation: str, model: str | None) -> None:
        self._operation = operation
        self._attributes["gen_ai.operation.name"] = operation
        if model is not None:
            self._model = self._attributes["gen_ai.request.model"] = model[:_MODEL_CHARS]

    def refused(self, reason: str) -> None:
        self._attributes["codec.refusal"] = reason

    def error(self, code: str) -> None:
        self._error = self._attributes["codec.error_code"] = code

    def codec_stream(
        self, outcome: StreamOutcome | None, token_source: str, verification: str | None
    ) -> None:
        attributes = self._attributes
        attributes["codec.token_source"] = token_source
        if verification is not None:
            attributes["codec.verification"] = verification
        if outcome is not None:
            attributes["gen_ai.response.finish_reasons"] = (outcome.finish_reason,)
            if outcome.model is not None:
                attributes["gen_ai.response.model"] = outcome.model[:_MODEL_CHARS]
            attributes["codec.tokens"] = outcome.tokens
            usage = outcome.usage
            # The backend's own count where it sent one; else the IDs it streamed.
            output = outcome.tokens
            if usage is not None:
                if usage.completion_tokens is not None:
                    output = usage.completion_tokens
                if usage.prompt_tokens is not None:
                    attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = output

    def end(self, record: RequestRecord) -> None:
        span = self._span
        try:
            if span.is_recording():
                attributes, failed = self._final(record)
                span.set_attributes(attributes)
                if failed:
                    span.set_status(_ERROR)
        finally:
            span.end()

    def _final(self, record: RequestRecord) -> tuple[Attributes, bool]:
        status = record.status
        attributes = self._attributes
        # The id the client got back (`X-Request-Id`): what a user who saw a failure can give.
        attributes["codec.request_id"] = record.forwarded_id
        attributes["codec.mode"] = record.mode
        attributes["codec.outcome"] = record.outcome
        if status:
            attributes["http.response.status_code"] = status
        optional = (
            ("codec.model", record.model),
            ("codec.stream_format", record.stream_format),
            ("codec.content_coding", record.encoding),
            ("codec.client_version", record.client_version),
        )
        attributes.update((key, value) for key, value in optional if value is not None)
        if record.upstream is not None:
            attributes["codec.bytes_sent"] = record.bytes_out
            # What the client would have downloaded as JSON: the upstream's body.
            attributes["codec.upstream_bytes"] = record.bytes_in
        if record.ttft is not None and self._operation is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = record.ttft
        failed = status >= 500 or record.outcome not in _NOT_FAILED
        if failed:
            if self._error is not None:
                attributes["error.type"] = self._error
            elif record.outcome not in _NOT_FAILED:
                attributes["error.type"] = record.outcome
            else:
                attributes["error.type"] = str(status)
        return attributes, failed


class _Attempt(UpstreamAttempt):
    def __init__(self, span: Span, fields: tuple[tuple[str, str], ...]) -> None:
        self._span = span
        self.fields = fields
        self._status = 0

    def answered(self, status: int) -> None:
        self._status = status

    def failed(self, error: BaseException) -> None:
        span = self._span
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(_ERROR)
        span.end()

    def ended(self) -> None:
        # What was received is the server span's `codec.upstream_bytes`.
        span = self._span
        status = self._status
        if status >= 400:  # a client span's error (the HTTP conventions)
            span.set_attributes({"http.response.status_code": status, "error.type": str(status)})
            span.set_status(_ERROR)
        else:
            span.set_attribute("http.response.status_code", status)
        span.end()


def _link_to(caller: Context) -> tuple[Link, ...]:
    """A link to the caller's span, when it sent a valid `traceparent`, so that its trace and
    the proxy's can be put together; without its `tracestate`, vendors' data of no use here."""
    context = trace_api.get_current_span(caller).get_span_context()
    if not context.is_valid:
        return ()
    linked = SpanContext(
        context.trace_id, context.span_id, is_remote=True, trace_flags=context.trace_flags
    )
    return (Link(linked),)


def _method(method: str) -> str:
    return method if method in _METHODS else "_OTHER"
