"""Response body framing and the upstream request head (proxy/core/http/framing.py)."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.http.framing import BodyFramer, Framing, HeaderInjection, request_head

writes = st.lists(st.binary(max_size=300), max_size=20)


def dechunk(wire: bytes) -> bytes:
    """A chunked body as a client's parser reads it, terminator included."""
    body: list[bytes] = []

    class Sink:
        def on_body(self, data: bytes) -> None:
            body.append(data)

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire)
    return b"".join(body)


@given(writes)
def test_chunked_writes_read_back_as_the_data_written(parts: list[bytes]) -> None:
    framer = BodyFramer.for_response(chunked=True, length=None, empty=False)
    wire = b"".join(framer.frame(part) for part in parts) + b"0\r\n\r\n"
    assert dechunk(wire) == b"".join(parts)
    assert framer.complete


def test_an_empty_write_is_never_a_chunk() -> None:
    # The zero-size chunk ends the body (RFC 9112 §7.1): an empty write must not send it.
    framer = BodyFramer(Framing.CHUNKED)
    assert framer.frame(b"") == b""
    assert framer.frame(b"abc") == b"3\r\nabc\r\n"
    assert framer.frame(b"x" * 255) == b"ff\r\n" + b"x" * 255 + b"\r\n"


@given(writes, st.integers(min_value=0, max_value=2000))
def test_content_length_is_never_exceeded(parts: list[bytes], length: int) -> None:
    framer = BodyFramer.for_response(chunked=False, length=length, empty=False)
    sent = b"".join(framer.frame(part) for part in parts)
    whole = b"".join(parts)
    assert sent == whole[:length]
    assert framer.complete == (len(whole) >= length)
    assert framer.remaining == max(0, length - len(whole))


def test_close_delimited_and_empty_bodies() -> None:
    close = BodyFramer.for_response(chunked=False, length=None, empty=False)
    assert close.framing is Framing.CLOSE
    assert close.frame(b"abc") == b"abc"
    # HEAD, 204 and 304 have no body whatever the headers say.
    empty = BodyFramer.for_response(chunked=True, length=5, empty=True)
    assert empty.framing is Framing.EMPTY
    assert empty.frame(b"abc") == b""
    assert empty.complete


def test_a_length_goes_with_content_length_framing_only() -> None:
    with pytest.raises(ValueError, match="length"):
        BodyFramer(Framing.LENGTH)
    with pytest.raises(ValueError, match="length"):
        BodyFramer(Framing.CHUNKED, 3)


def test_request_head() -> None:
    head = request_head(
        "POST",
        "/v1/completions?x=1",
        [("Host", "up:8000"), ("Accept", "text/event-stream"), ("X-Note", "café")],
        body_length=12,
    )
    assert head == (
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: up:8000\r\nAccept: text/event-stream\r\n"
        b"X-Note: caf\xc3\xa9\r\nContent-Length: 12\r\n\r\n"
    )
    assert request_head("GET", "/health", [("Host", "h")], body_length=None) == (
        b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("POST", "/v1/completions", [("X-Evil", "a\r\nInjected: 1")]),
        ("POST", "/v1/completions", [("X-Evil", "a\nb")]),
        ("POST", "/v1/completions", [("Bad Name", "v")]),
        ("POST", "/v1/completions", [("X\r\nY", "v")]),
        ("POST", "/a b", []),
        ("POST", "/a\r\nHost: evil", []),
        ("GE T", "/", []),
    ],
)
def test_a_head_that_would_break_the_message_is_refused(
    method: str, target: str, headers: list[tuple[str, str]]
) -> None:
    with pytest.raises(HeaderInjection):
        request_head(method, target, [("Host", "h"), *headers], body_length=0)
