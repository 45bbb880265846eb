"""A trace collector for benchmarks: takes OTLP/HTTP exports, counts their spans, keeps nothing.

    .venv/bin/python -m bench.otlp_sink --port 4318

`POST /v1/traces` answers 200 with an empty `ExportTraceServiceResponse`; `GET /count` says how
many spans and exports arrived (bench/paced.py checks that every traced request's spans were
exported); `GET /health` answers 200. Its own process, so its CPU is never the relay's.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_EMPTY = ExportTraceServiceResponse().SerializeToString()


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans = 0
        self.exports = 0


COUNTS = Counts()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive, as collectors are

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        export = ExportTraceServiceRequest.FromString(body)
        spans = sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        with COUNTS.lock:
            COUNTS.spans += spans
            COUNTS.exports += 1
        self._answer(_EMPTY, "application/x-protobuf")

    def do_GET(self) -> None:
        with COUNTS.lock:
            counts = {"spans": COUNTS.spans, "exports": COUNTS.exports}
        self._answer(json.dumps(counts).encode(), "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per export would only be noise


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), Sink).serve_forever()


if __name__ == "__main__":
    main()
