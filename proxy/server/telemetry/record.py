"""One record per request: what it did, filled in as it goes, logged and counted once.

Every request gets an id of the proxy's own (`id`), unique whatever clients send. A client's
`X-Request-Id` is kept beside it (`client_request_id`) and is what is forwarded upstream and
echoed back, so a trace crosses the proxy; without one, the proxy's own goes instead. Log lines
name both: a client's id is only its claim, and another client may send the same.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
import time
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from proxy.core.backend.routing import NO_MODEL

REQUEST_ID_HEADER = "X-Request-Id"
# A client-chosen id is kept only if it is short and plain: it lands in logs and upstream headers.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


@dataclass(slots=True)
class RequestRecord:
    """What one request did. Handlers fill in what they know; the middleware logs it."""

    id: str  # the proxy's own
    method: str
    route: str
    # The client's `X-Request-Id`, when it sent one fit for logs and headers.
    client_request_id: str | None = None
    # The request's trace (32 hex digits), when traces are exported (telemetry/worker_tracer.py).
    trace_id: str | None = None
    started: float = field(default_factory=time.monotonic)
    mode: str = "local"  # codec | passthrough | local (answered by the proxy itself)
    stream_format: str | None = None
    encoding: str | None = None
    client_version: str | None = None
    upstream: str | None = None
    # The configured model the request was routed to (never the raw name a client sent).
    model: str | None = None
    status: int = 0
    tokens: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    ttft: float | None = None  # seconds from start to the first body bytes sent
    outcome: str = "ok"
    # Where the request was when it ended: reading_request, upstream_headers, first_byte,
    # first_token, streaming. Labels client disconnects.
    phase: str = "reading_request"
    # The whole response has been written: whatever cancels the handler later (the client
    # hanging up while we read the rest of the upstream's body) does not undo that.
    completed: bool = False

    @property
    def forwarded_id(self) -> str:
        """The id sent upstream and echoed back: the client's, else the proxy's own."""
        return self.client_request_id or self.id

    def described(self) -> str:
        """Both ids, for a log line: `<own>` or `<own> (X-Request-Id <client's>)`."""
        if self.client_request_id is None:
            return self.id
        return f"{self.id} ({REQUEST_ID_HEADER} {self.client_request_id})"

    def log_fields(self) -> dict[str, object]:
        # Every field is a plain value: a shallow copy (asdict's deep one cost a fifth of a
        # streamed request's own CPU), read in one call.
        fields = dict(zip(_LOGGED, _logged_values(self), strict=True))
        # The value the metrics carry (`none` for requests no model applies to), so a log
        # line and the series it was counted in can be matched by the same label.
        fields["model"] = self.model or NO_MODEL
        fields["duration"] = round(time.monotonic() - self.started, 6)
        if self.ttft is not None:
            fields["ttft"] = round(self.ttft, 6)
        return fields


# Every field but the two that are the record's own bookkeeping, in their order.
_LOGGED: Final = tuple(
    field.name
    for field in dataclasses.fields(RequestRecord)
    if field.name not in ("started", "completed")
)
_logged_values: Final = operator.attrgetter(*_LOGGED)
RECORD = web.RequestKey("record", RequestRecord)


def new_record(request: web.Request, route: str) -> RequestRecord:
    """The record of a request just arrived: a fresh id, and the client's if it is usable."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    client_request_id = given if _SAFE_REQUEST_ID.fullmatch(given) else None
    # 128 random bits in 32 hex digits, the shape `uuid4().hex` had (whose six fixed bits
    # only made it a UUID), at a fraction of its cost.
    return RequestRecord(
        os.urandom(16).hex(), request.method, route, client_request_id=client_request_id
    )


def stream_end(record: RequestRecord) -> str | None:
    """How a streamed upstream answer ended, as a bounded label; None if none was streamed."""
    if record.upstream is None:
        return None
    outcome = record.outcome
    if outcome == "ok":
        return "complete" if record.completed else "error"
    if outcome in ("client_disconnect", "policy_stop", "slow_client"):
        return outcome
    if outcome == "ended_by_shutdown":
        return "shutdown"
    return "error"


def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """As a response is prepared: every response, streamed or not, carries its request id."""
    record = request.get(RECORD)
    if record is not None:
        response.headers[REQUEST_ID_HEADER] = record.forwarded_id
