"""Log setup: one JSON object per line (default) or plain text, to stderr.

Access log records carry their fields as a dict (`extra={"fields": ...}`), so in JSON mode a
line is one flat object a log pipeline can index without parsing a message.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import time
from typing import Final, TextIO

import orjson

from proxy.core.shown import clipped, without_credentials

# C0 and C1 controls, DEL, and Unicode's line and paragraph separators: what ends a line, or
# moves the cursor, in a terminal or a log viewer. Escaped, one text record stays one line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(text: str) -> str:
    return _CONTROL.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line. JSON strings escape every control character (RFC 8259 §7), so
    no value can end the line; upstream URLs lose their credentials."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and not record.exc_info:
            return self.fields_line(record.created, record.levelname, record.name, fields)
        line = _json_head(record.created, record.levelname, record.name)
        if isinstance(fields, dict):
            line.update(_shown(fields))
        else:
            line["message"] = without_credentials(record.getMessage())
        if record.exc_info:
            line["error"] = without_credentials(self.formatException(record.exc_info))
        return _json(line)

    def fields_line(
        self, created: float, level: str, logger: str, fields: dict[str, object]
    ) -> str:
        """The line of a record of `fields` (the access log's), made at `created`."""
        line = _json_head(created, level, logger)
        line.update(_shown(fields))
        return _json(line)


def _json_head(created: float, level: str, logger: str) -> dict[str, object]:
    # `created - int(created)`: the milliseconds a LogRecord keeps (`msecs`).
    return {
        "ts": f"{_utc_second(int(created))}.{int((created - int(created)) * 1000):03d}Z",
        "level": level,
        "logger": logger,
    }


@functools.lru_cache(maxsize=2)
def _utc_second(second: int) -> str:
    """A second's UTC time, formatted once for all the lines of that second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _shown(fields: dict[str, object]) -> dict[str, object]:
    """`fields` with URL credentials out of every text value (only one with an `@` can hold
    some: the others are `fields` as they are)."""
    shown = None
    for key, value in fields.items():
        if isinstance(value, str) and "@" in value:
            if shown is None:
                shown = dict(fields)
            shown[key] = without_credentials(value)
    return fields if shown is None else shown


def _json(line: dict[str, object]) -> str:
    # orjson: a line per request, at a tenth of the json module's cost.
    return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """`time level logger: message`, one line per record: control characters are escaped, so a
    newline in a value (a `%0a` in a path, an upstream's error text) cannot start a line that
    looks like a record. A traceback keeps its lines, each indented, so none of them can look
    like one either. Upstream URLs lose their credentials."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        message = _text_of(fields) if isinstance(fields, dict) else record.getMessage()
        line = self._line(record.created, record.levelname, record.name, message)
        if record.exc_info:
            detail = without_credentials(self.formatException(record.exc_info))
            line += "".join(f"\n    {_escaped(part)}" for part in detail.split("\n"))
        return line

    def fields_line(
        self, created: float, level: str, logger: str, fields: dict[str, object]
    ) -> str:
        """The line of a record of `fields` (the access log's), made at `created`."""
        return self._line(created, level, logger, _text_of(fields))

    def _line(self, created: float, level: str, logger: str, message: str) -> str:
        # logging.Formatter.formatTime's default: local time, then `,` and the milliseconds.
        stamp = time.strftime(self.default_time_format, self.converter(created))
        millis = int((created - int(created)) * 1000)
        return f"{stamp},{millis:03d} {level} {logger}: " + _escaped(without_credentials(message))


def _text_of(fields: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)


class FieldsLog:
    """A logger's records of fields, written cheaply: the access log, a line per request.

    Through `logging`, a line costs a `LogRecord` (the caller's frame looked up, the thread and
    process named), the handler's filters and a formatter: several times what formatting the
    line itself costs. When nothing but the handler `configure` installed would see the record
    (no other handler, no filter on the way), the line is formatted by that handler's formatter,
    exactly as `logging` would, and written to its stream under its lock. Otherwise (a handler a
    test or an embedding program added, a filter) the record goes through `logging` as before.
    """

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    @property
    def enabled(self) -> bool:
        """Whether an `info` record is written at all (its fields need not be made if not)."""
        return self._logger.isEnabledFor(logging.INFO)

    def info(self, message: str, fields: dict[str, object]) -> None:
        logger = self._logger
        handler = _only_handler(logger)
        formatter = None if handler is None else handler.formatter
        if handler is None or not isinstance(formatter, JsonFormatter | TextFormatter):
            logger.info(message, extra={"fields": fields})
            return
        line = formatter.fields_line(time.time(), "INFO", logger.name, fields)
        with handler.lock:  # type: ignore[union-attr]  # a StreamHandler's lock exists
            try:
                handler.stream.write(line + handler.terminator)
                handler.flush()
            except Exception:
                handler.handleError(logging.makeLogRecord({"msg": line}))


# The handler `configure` installed: the one `FieldsLog` may write to directly.
_INSTALLED: list[logging.StreamHandler[TextIO]] = []


def _only_handler(logger: logging.Logger) -> logging.StreamHandler[TextIO] | None:
    """The handler `configure` installed, when it is the only one a record of `logger` would
    reach, with nothing on the way that could filter or change the record."""
    if not _INSTALLED:
        return None
    installed = _INSTALLED[0]
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or (node.handlers and node.parent is not None) or not node.propagate:
            return None
        if node.parent is None and (node.handlers != _INSTALLED or installed.filters):
            return None  # the root, with another handler than ours, or ours filtering
        node = node.parent
    return installed if installed.level <= logging.INFO else None


class UnparsedRequests(logging.Filter):
    """aiohttp logs each request it could not parse with its parser's traceback, whose message
    quotes the offending line: up to 8 KiB of a client's bytes, four times that escaped, per
    request. The client has its 400 (`connection_error`, server/control/errors.py); the log
    keeps one line, the parser's message bounded like any client value."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Imported here: the CLI's other commands never load aiohttp.
        from aiohttp.http_exceptions import HttpProcessingError

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {clipped(error.message)}"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


UNPARSED_REQUESTS: Final = UnparsedRequests()


def configure(log_format: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _INSTALLED[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if UNPARSED_REQUESTS not in server_log.filters:
        server_log.addFilter(UNPARSED_REQUESTS)


def set_level(level: str) -> None:
    """The level of every logger that has none of its own (a reload's `log_level`)."""
    logging.getLogger().setLevel(level)
