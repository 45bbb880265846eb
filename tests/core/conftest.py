"""Readers for the captured upstream responses in tests/fixtures/upstream (see its README.md).

Plain functions, imported by the test modules: parametrisation needs the names at collection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

UPSTREAM_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "upstream"


@dataclass(frozen=True, slots=True)
class Capture:
    """One captured response. Body-only captures (no status line) have `status` None."""

    status: int | None
    headers: dict[str, str]
    body: bytes


def capture_names() -> list[str]:
    return sorted(path.name for path in UPSTREAM_FIXTURES.glob("*.txt"))


def read_capture(name: str) -> Capture:
    raw = (UPSTREAM_FIXTURES / name).read_bytes()
    if not raw.startswith(b"HTTP/"):
        return Capture(None, {}, raw)
    # The head ends at the first CRLF CRLF; a few head lines were edited and end in a bare LF.
    head, body = raw.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    headers = {}
    for line in header_lines:
        name_, _, value = line.partition(":")
        headers[name_.strip().lower()] = value.strip()
    return Capture(int(status_line.split()[1]), headers, body)


def is_event_stream(capture: Capture) -> bool:
    # Body-only captures are all SSE streams (see the fixtures README).
    if capture.status is None:
        return True
    return capture.headers.get("content-type", "").startswith("text/event-stream")
