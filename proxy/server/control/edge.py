"""What every request of the serving app (and of the admin app) goes through, in one middleware
and one response hook.

aiohttp runs each middleware and each `on_response_prepare` hook as a coroutine of its own: a
frame, an await and a wrapper per request for each, most of which only set a value or check a
header. Here the steps are plain calls, in this order, each in the module it belongs to:

1. the configuration snapshot the request keeps (`take_snapshot`, models/live.py);
2. its record and server span (`observe_start`, observe.py), the access-log line, counters
   and span end whatever happens after (`observe_failure`, `observe_end`);
3. errors as JSON (`error_answer`, errors.py), for what the steps below and the handler raise;
4. the API key (`KeyCheck`, auth.py; not on the admin app);
5. `Expect: 100-continue` answered only now (expect.py);
6. the handler.

As each response is prepared: its request id (telemetry/record.py) and trace
(telemetry/request_trace.py), `Codec-Server-Version` (versioning.py), then the header floors, after
every step that adds a Codec header (versioning.py).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.server.control.auth import KeyCheck
from proxy.server.control.errors import error_answer
from proxy.server.control.expect import expects_continue, send_continue
from proxy.server.control.observe import observe_end, observe_failure, observe_start
from proxy.server.control.versioning import announce_server_version, strip_withheld_headers
from proxy.server.models.live import take_snapshot
from proxy.server.telemetry.record import echo_request_id
from proxy.server.telemetry.request_trace import echo_trace


def edge_middleware(key_check: KeyCheck | None) -> Middleware:
    """The one middleware; `key_check` None: no API keys (the admin app)."""

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        take_snapshot(request)
        record = observe_start(request)
        try:
            try:
                if key_check is not None:
                    key_check(request)
                if expects_continue(request):
                    await send_continue(request)
                response = await handler(request)
            except Exception as exc:
                answer = error_answer(request, exc)
                if answer is None:
                    raise
                response = answer
            record.status = response.status
            return response
        except BaseException as exc:
            observe_failure(request, record, exc)
            raise
        finally:
            observe_end(request, record)

    return edge


async def response_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The serving app's one `on_response_prepare` hook."""
    echo_request_id(request, response)
    echo_trace(request, response)
    announce_server_version(request, response)
    # The one place the header floors are applied: after every step that adds a Codec header.
    strip_withheld_headers(request, response)


async def admin_response_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The admin app's: its answers are the proxy's own documents, never Codec responses."""
    echo_request_id(request, response)
