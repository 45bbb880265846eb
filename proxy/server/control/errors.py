"""Turn `ProxyError`s (and aiohttp's own HTTP errors) into OpenAI-style JSON error responses.

The errors aiohttp writes before any handler runs (malformed requests) are made JSON by the
connection itself (proxy/server/data/client_protocol.py, rendered by `connection_error`), an
unknown `Expect` by proxy/server/control/expect.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from http import HTTPStatus

from aiohttp import web

from proxy.core.errors import ProxyError, UpgradeRequired
from proxy.core.shown import clipped, quoted
from proxy.server.telemetry.record import RECORD
from proxy.server.telemetry.request_trace import TRACE

log = logging.getLogger("codec_proxy")


def json_error(
    status: int,
    message: str,
    *,
    error_type: str,
    code: str | None = None,
    param: str | None = None,
) -> web.Response:
    """`{"error": {"message", "type", "code"}}`, the shape OpenAI clients already parse (with
    `param` when one request field is at fault)."""
    error: dict[str, str | None] = {"message": message, "type": error_type, "code": code}
    if param is not None:
        error["param"] = param
    body = {"error": error}
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
    )


def connection_error(status: int, message: str | None) -> web.Response:
    """What a connection answers when aiohttp itself failed a request (a malformed head, an
    unhandled exception): the one JSON shape, never a traceback or an exception's text. A
    parser's message quotes the bytes it failed on: it is cut like any client value."""
    phrase = HTTPStatus(status).phrase
    if status >= 500:
        code = phrase.lower().replace(" ", "_")
        return json_error(status, phrase, error_type="server_error", code=code)
    return json_error(
        status,
        clipped(message or phrase),
        error_type="invalid_request_error",
        code="malformed_request",
    )


def method_not_allowed(
    method: str, what: str, allow: str, *, headers: Iterable[tuple[str, str]] = ()
) -> web.Response:
    """405 with its `Allow` (RFC 9110 §15.5.6), in the same JSON shape as every other error."""
    response = json_error(
        405,
        f"{clipped(method)} is not allowed on {what}",
        error_type="invalid_request_error",
        code="method_not_allowed",
    )
    response.headers.update([("Allow", allow), *headers])
    return response


def error_response(exc: ProxyError) -> web.Response:
    if isinstance(exc, UpgradeRequired):
        # Its exact body and headers are the protocol (codec-spec.md §6): sent as built.
        return web.Response(status=exc.status_hint, body=exc.body, headers=exc.headers)
    message = exc.public_message or exc.message
    response = json_error(
        exc.status_hint, message, error_type=exc.error_type, code=exc.code, param=exc.param
    )
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    challenge = getattr(exc, "www_authenticate", None)
    if challenge is not None:
        response.headers["WWW-Authenticate"] = challenge  # with every 401 (RFC 9110 §15.5.2)
    return response


def http_error(exc: web.HTTPException) -> web.Response:
    """One of aiohttp's own HTTP errors (a 404 outside every route, a 413 from its body cap),
    in the JSON shape, keeping headers such as `Allow`."""
    code = "body_too_large" if exc.status == 413 else exc.reason.lower().replace(" ", "_")
    response = json_error(
        exc.status,
        exc.text or exc.reason,
        error_type="invalid_request_error" if exc.status < 500 else "server_error",
        code=code,
    )
    for name, value in exc.headers.items():
        if name.lower() not in ("content-type", "content-length"):
            response.headers.add(name, value)
    return response


def error_answer(request: web.Request, exc: Exception) -> web.Response | None:
    """The JSON answer to what a handler (or the edge's checks) raised, logged; None when
    `exc` must go on up instead. Called by the edge's middleware (server/control/edge.py) in
    its `except` clause, so a logged traceback is the handler's."""
    if isinstance(exc, ProxyError):
        # The whole message goes to the log; a client may only see `public_message`.
        level = logging.WARNING if exc.status_hint >= 500 else logging.INFO
        log.log(level, "%s -> %d %s", _target(request), exc.status_hint, exc.message)
        trace = request.get(TRACE)
        if trace is not None:
            trace.error(exc.code or exc.error_type)
        return error_response(exc)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            return None  # a redirect or success raised as an exception is not an error
        return http_error(exc)
    if isinstance(exc, ConnectionError):
        return None  # a client that left: not ours to turn into a 500
    if request.get(RECORD) is not None and request[RECORD].phase == "streaming":
        return None  # the status line is gone: the connection is closed instead
    # A bug: the traceback goes to the log under the request id, never to the client.
    log.exception("%s -> 500 internal error", _target(request))
    return json_error(
        500,
        "the proxy failed to handle this request",
        error_type="server_error",
        code="internal_error",
    )


def _target(request: web.Request) -> str:
    """The request as a log line names it: method and path (the client's, so bounded and
    quoted), and its ids, which find its access-log line."""
    record = request.get(RECORD)
    ids = "" if record is None else f" (request {record.described()})"
    return f"{clipped(request.method)} {quoted(request.path)}{ids}"
