"""Log lines: one record is one line in either format, and no line shows URL credentials."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from proxy import logs
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


@pytest.fixture
def configured() -> Iterator[Callable[[str], io.StringIO]]:
    """`logs.configure` as the CLI calls it, its output in a buffer; logging restored after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def configure(log_format: str) -> io.StringIO:
        logs.configure(log_format, "INFO")
        out = io.StringIO()
        root.handlers[0].setStream(out)  # type: ignore[attr-defined]
        return out

    yield configure
    root.handlers[:], level = saved
    root.setLevel(level)
    logs._INSTALLED.clear()


ACCESS_FIELDS: dict[str, object] = {
    "id": "0" * 32,
    "route": FORGED,
    "upstream": SECRET_URL,
    "status": 200,
    "ttft": 0.0123,
    "model": None,
}


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_an_access_line_written_directly_is_the_line_logging_would_write(
    configured: Callable[[str], io.StringIO],
    log_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = configured(log_format)
    monkeypatch.setattr(time, "time", lambda: 1_795_977_989.0427)
    # Through logging, as every other record goes.
    logging.getLogger("codec_proxy.access").info("request", extra={"fields": ACCESS_FIELDS})
    through_logging = out.getvalue()
    out.truncate(0)
    out.seek(0)
    logs.FieldsLog("codec_proxy.access").info("request", ACCESS_FIELDS)
    assert out.getvalue() == through_logging
    assert through_logging.count("\n") == 1
    assert "s3cret" not in through_logging
    assert ".042" in through_logging or ",042" in through_logging


def test_an_access_line_alone_on_its_way_makes_no_log_record(
    configured: Callable[[str], io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = configured("json")

    def no_record(*args: object, **kwargs: object) -> logging.LogRecord:
        raise AssertionError("a LogRecord was made")

    monkeypatch.setattr(logging.Logger, "makeRecord", no_record)
    logs.FieldsLog("codec_proxy.access").info("request", {"id": "a", "status": 200})
    line = json.loads(out.getvalue())
    assert (line["logger"], line["id"], line["status"]) == ("codec_proxy.access", "a", 200)


def test_an_access_line_goes_through_logging_when_another_handler_or_a_filter_would_see_it(
    configured: Callable[[str], io.StringIO],
) -> None:
    out = configured("json")
    access = logging.getLogger("codec_proxy.access")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    extra = Keep()
    logging.getLogger().addHandler(extra)  # as pytest's caplog does
    try:
        logs.FieldsLog("codec_proxy.access").info("request", {"id": "a"})
    finally:
        logging.getLogger().removeHandler(extra)
    assert [getattr(r, "fields", None) for r in seen] == [{"id": "a"}]
    assert json.loads(out.getvalue())["id"] == "a"  # and ours still wrote it

    dropping = logging.Filter("nothing")  # passes only records of a logger named `nothing`
    access.addFilter(dropping)
    try:
        logs.FieldsLog("codec_proxy.access").info("request", {"id": "b"})
    finally:
        access.removeFilter(dropping)
    assert '"b"' not in out.getvalue()
    logging.getLogger().setLevel(logging.WARNING)
    assert not logs.FieldsLog("codec_proxy.access").enabled
