"""Log lines: one record is one line in either format, and no line shows URL credentials."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from proxy.logs import UNPARSED_REQUESTS, JsonFormatter, TextFormatter

# What a client or an upstream can put in a value that reaches a log line: a line that looks
# like a record of its own, a carriage return, a terminal escape, Unicode's line separator.
FORGED = (
    "x\n2026-01-01 00:00:00,000 ERROR codec_proxy: forged\r\n"
    "2026-01-01 00:00:00,000 ERROR codec_proxy: forged\x1b[2J\u2028\x85end"
)
SECRET_URL = "http://alice:s3cret@vllm:8000"


def record(
    message: str = "%s",
    *args: object,
    fields: dict[str, object] | None = None,
    exc: BaseException | None = None,
) -> logging.LogRecord:
    made = logging.LogRecord("codec_proxy", logging.WARNING, __file__, 1, message, args, None)
    if fields is not None:
        made.fields = fields
    if exc is not None:
        try:
            raise exc
        except BaseException:
            made.exc_info = sys.exc_info()
    return made


def no_control_characters(text: str) -> bool:
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in text)


@pytest.mark.parametrize(
    "made",
    [
        record("upstream error: %s", FORGED),
        record("request", fields={"id": "a", "route": FORGED, "status": 200}),
    ],
    ids=["message", "fields"],
)
def test_a_text_record_is_one_line_whatever_its_values_hold(made: logging.LogRecord) -> None:
    line = TextFormatter().format(made)
    assert no_control_characters(line)
    assert "\\n2026-01-01 00:00:00,000 ERROR" in line  # escaped, still readable
    assert "\\x1b[2J" in line
    assert "\\u2028" in line
    assert "\\x85" in line


def test_a_text_traceback_keeps_its_lines_none_of_which_looks_like_a_record() -> None:
    line = TextFormatter().format(record("boom", exc=ValueError(FORGED)))
    first, *rest = line.split("\n")
    assert first.endswith("WARNING codec_proxy: boom")
    assert rest[0] == "    Traceback (most recent call last):"
    assert all(part.startswith("    ") for part in rest)
    assert all(no_control_characters(part) for part in rest)


def test_json_lines_were_already_one_line() -> None:
    # json.dumps escapes every control character (RFC 8259 §7): nothing to add but the test.
    for made in (
        record("upstream error: %s", FORGED),
        record("request", fields={"route": FORGED}),
        record("boom", exc=ValueError(FORGED)),
    ):
        line = JsonFormatter().format(made)
        assert "\n" not in line
        assert "\r" not in line
        parsed = json.loads(line)
        assert FORGED in parsed.get("message", "") + parsed.get("route", "") + parsed.get(
            "error", ""
        )


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()], ids=["text", "json"])
def test_no_log_line_shows_url_credentials(formatter: logging.Formatter) -> None:
    for made in (
        record("upstream %s is now unhealthy", SECRET_URL),
        record("request", fields={"upstream": SECRET_URL, "status": 502}),
        record("failed", exc=ConnectionError(f"Connection timeout to host {SECRET_URL}/v1")),
    ):
        line = formatter.format(made)
        assert "s3cret" not in line
        assert "alice" not in line
        assert "http://***@vllm:8000" in line


def test_an_unparsable_request_is_one_bounded_line_without_its_traceback() -> None:
    # aiohttp's own log of a request it could not parse quotes the offending line.
    error = BadHttpMessage(f"Invalid header value char:\n\n  {b'X-A: ' + b'a' * 8000!r}\n  ^")
    made = record("Error handling request from %s", "127.0.0.1", exc=error)
    made.name = "aiohttp.server"
    assert UNPARSED_REQUESTS.filter(made)
    line = TextFormatter().format(made)
    assert "Traceback" not in line
    assert len(line) < 400
    assert "Error handling request from 127.0.0.1: Invalid header value char" in line
    other = record("Error handling request", exc=RuntimeError("a bug"))
    assert UNPARSED_REQUESTS.filter(other)
    assert other.exc_info is not None  # a real failure keeps its traceback
