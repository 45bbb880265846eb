"""Log setup: one JSON object per line (default) or plain text, to stderr.

Access log records carry their fields as a dict (`extra={"fields": ...}`), so in JSON mode a
line is one flat object a log pipeline can index without parsing a message.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Final

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
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(
                (key, without_credentials(value) if isinstance(value, str) else value)
                for key, value in fields.items()
            )
        else:
            line["message"] = without_credentials(record.getMessage())
        if record.exc_info:
            line["error"] = without_credentials(self.formatException(record.exc_info))
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
        if isinstance(fields, dict):
            message = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        else:
            message = record.getMessage()
        line = (
            f"{self.formatTime(record, self.datefmt)} {record.levelname} {record.name}: "
            + _escaped(without_credentials(message))
        )
        if record.exc_info:
            detail = without_credentials(self.formatException(record.exc_info))
            line += "".join(f"\n    {_escaped(part)}" for part in detail.split("\n"))
        return line


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
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if UNPARSED_REQUESTS not in server_log.filters:
        server_log.addFilter(UNPARSED_REQUESTS)


def set_level(level: str) -> None:
    """The level of every logger that has none of its own (a reload's `log_level`)."""
    logging.getLogger().setLevel(level)
