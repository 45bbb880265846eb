"""`Expect` (RFC 9110 §10.1.1), answered after the API key check, in the one JSON shape.

aiohttp answers `Expect` before any middleware runs: `100 Continue` even to a client that is
then refused with 401 (which then uploads its body for nothing), and a plain-text 417 for any
other expectation. Here every route's expect handler does nothing, and the edge's middleware
(server/control/edge.py), after the key check, sends the `100 Continue` (`send_continue`) when
`expects_continue` says so, which raises the 417.
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.errors import BadRequest
from proxy.core.shown import quoted


class ExpectationFailed(BadRequest):
    """An `Expect` other than 100-continue (417)."""

    status_hint = 417


async def expect_nothing(request: web.Request) -> None:
    """The routes' expect handler: the edge's middleware answers instead."""


def with_expect_handler(routes: list[web.RouteDef]) -> list[web.RouteDef]:
    return [
        web.RouteDef(r.method, r.path, r.handler, {**r.kwargs, "expect_handler": expect_nothing})
        for r in routes
    ]


def expects_continue(request: web.Request) -> bool:
    """Whether `request` waits for a `100 Continue`; the 417 for any other expectation."""
    expect = request.headers.get("Expect")
    # §10.1.1: an HTTP/1.0 request's expectation is ignored.
    if expect is None or request.version < (1, 1):
        return False
    if expect.strip().lower() != "100-continue":
        raise ExpectationFailed(
            f"unsupported expectation: {quoted(expect)}", code="expectation_failed"
        )
    return True


async def send_continue(request: web.Request) -> None:
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # an interim response: the response proper starts now
