"""A fake OpenAI backend that replays responses captured from real llama.cpp and vLLM servers.

The captures (tests/fixtures/upstream/) are the bytes those servers really sent. The fake
serves them back, cut into chunks as a network would, and can inject faults: drop the
connection mid-stream, slip in a malformed or error event, or stall between events.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

UPSTREAM_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "upstream"


@dataclass(frozen=True)
class Capture:
    """One captured HTTP response: status line, headers as sent, body bytes."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @property
    def is_sse(self) -> bool:
        return any(
            name.lower() == "content-type" and value.startswith("text/event-stream")
            for name, value in self.headers
        )

    @property
    def events(self) -> list[bytes]:
        """The SSE body cut into events, each with its blank-line terminator."""
        return [part + b"\n\n" for part in self.body.split(b"\n\n") if part]

    def stream_text(self, *, chat: bool = False) -> str:
        """Concatenated generated text of the capture's choice 0."""
        text = []
        for event in self.events:
            data = event.decode().removeprefix("data: ").strip()
            if data == "[DONE]":
                continue
            choices = json.loads(data).get("choices") or []
            for choice in choices:
                if chat:
                    delta = choice.get("delta", {})
                    text.append(delta.get("reasoning_content") or "")
                    text.append(delta.get("content") or "")
                else:
                    text.append(choice.get("text", ""))
        return "".join(text)


def load_capture(name: str) -> Capture:
    raw = (UPSTREAM_FIXTURES / name).read_bytes()
    if not raw.startswith(b"HTTP/"):
        # Body-only captures are llama.cpp SSE streams.
        return Capture(200, "OK", (("Content-Type", "text/event-stream"),), raw)
    blank_line = re.search(rb"\r?\n\r?\n", raw)
    assert blank_line is not None, name
    head, body = raw[: blank_line.start()], raw[blank_line.end() :]
    status_line, *lines = re.split(r"\r?\n", head.decode("latin-1"))
    _, status, reason = status_line.split(" ", 2)
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        if name.lower() in ("date", "transfer-encoding", "content-length", "keep-alive"):
            continue
        headers.append((name, value.strip()))
    return Capture(int(status), reason, tuple(headers), body)


# A backend's Prometheus metrics as an endpoint picker reads them (vLLM's names: the queue and
# the KV cache it routes by), for `FakeUpstream.paths`.
BACKEND_METRICS = Capture(
    200,
    "OK",
    (("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),),
    b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="smollm2"} 3.0\n'
    b"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{model_name="smollm2"} 0.42\n',
)


@dataclass
class Script:
    """What the fake answers next, and how."""

    capture: Capture
    chunk_size: int | None = None  # None: one write per event
    delay: float = 0.0  # seconds between writes
    drop_after_events: int | None = None  # close the connection abruptly after N events
    inject_after_events: int | None = None  # insert `inject` after N events
    inject: bytes = b""
    header_delay: float = 0.0  # seconds before the status line is sent
    stall_after_events: int | None = None  # go silent after N events...
    stall_seconds: float = 0.0  # ...for this long
    stall_until: asyncio.Event | None = None  # ...or, when given, until this is set
    hang_up: bool = False  # read the request, then close the connection without answering
    # Like a backend that closes kept-alive connections after a response (llama.cpp after a
    # stream): a second request on a connection is read and dropped unanswered.
    hang_up_on_reused_connection: bool = False


@dataclass
class RecordedRequest:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes
    raw_headers: tuple[tuple[bytes, bytes], ...] = ()  # as received, bytes for bytes


@dataclass
class FakeUpstream:
    """State of one fake backend: the script it follows and every request it received."""

    script: Script = field(
        default_factory=lambda: Script(load_capture("llamacpp-completions-sample.txt"))
    )
    requests: list[RecordedRequest] = field(default_factory=list)
    # What GET /v1/models lists, and what each entry says besides its id (vLLM's
    # `max_model_len`, llama.cpp's `meta`).
    models: list[str] = field(default_factory=lambda: ["smollm2"])
    model_fields: dict[str, Any] = field(default_factory=dict)
    # The `Server` header of that answer (None: aiohttp's own).
    models_server: str | None = None
    # A JSON body with any of these top-level fields gets a 400, as a server that does not
    # know them might answer (llama.cpp: logprobs with tools in a stream).
    refuse_fields: tuple[str, ...] = ()
    # The proxy's own health checks, kept apart from the traffic it relays.
    health_checks: list[RecordedRequest] = field(default_factory=list)
    health_code: int = 200
    health_status: str = "ok"
    server: Any = None  # the TestServer serving it, when a test needs to stop it
    _seen_transports: set[int] = field(default_factory=set)
    # How each replayed stream ended: "complete", "dropped" (by script) or "aborted" (the
    # proxy hung up on us, as it must when its client leaves).
    outcomes: list[str] = field(default_factory=list)
    # Event-loop times at which scripted stalls began.
    stalled_at: list[float] = field(default_factory=list)
    # Paths answered with a capture of their own, whatever the script (a backend's /metrics).
    paths: dict[str, Capture] = field(default_factory=dict)

    def app(self) -> web.Application:
        # Request bodies are recorded as sent, content coding and all, and may be as long as
        # the proxy's (aiohttp's default cap is 1 MiB; backends take long prompts).
        app = web.Application(client_max_size=64 << 20, handler_args={"auto_decompress": False})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        recorded = RecordedRequest(
            request.method, request.raw_path, dict(request.headers), body, request.raw_headers
        )
        if request.headers.get("User-Agent") == "codec-proxy-health-check":
            self.health_checks.append(recorded)
            return web.json_response({"status": self.health_status}, status=self.health_code)
        self.requests.append(recorded)
        own = self.paths.get(request.path)
        if own is not None:
            headers = CIMultiDict(own.headers)
            return web.Response(
                status=own.status, reason=own.reason, headers=headers, body=own.body
            )
        if request.path == "/health":
            return web.json_response({"status": "ok"})
        if request.path == "/v1/models":
            data = [{"id": name, "object": "model", **self.model_fields} for name in self.models]
            server = {} if self.models_server is None else {"Server": self.models_server}
            return web.json_response({"object": "list", "data": data}, headers=server)
        if self.refuse_fields and body.startswith(b"{"):
            refused = sorted(set(json.loads(body)) & set(self.refuse_fields))
            if refused:
                error = {"code": 400, "message": f"unsupported: {refused}", "type": "bad"}
                return web.json_response({"error": error}, status=400)
        return await self._replay(request)

    async def _replay(self, request: web.Request) -> web.StreamResponse:
        script = self.script
        capture = script.capture
        reused = id(request.transport) in self._seen_transports
        self._seen_transports.add(id(request.transport))
        if script.hang_up or (script.hang_up_on_reused_connection and reused):
            assert request.transport is not None
            request.transport.close()
            self.outcomes.append("hung_up")
            return web.Response()
        if script.header_delay:
            try:
                await asyncio.sleep(script.header_delay)
            except asyncio.CancelledError:
                self.outcomes.append("aborted")
                raise
        response = web.StreamResponse(status=capture.status, reason=capture.reason)
        for name, value in capture.headers:
            response.headers.add(name, value)
        if not capture.is_sse:
            response.content_length = len(capture.body)
            await response.prepare(request)
            await response.write(capture.body)
            await response.write_eof()
            return response
        await response.prepare(request)
        try:
            for index, event in enumerate(capture.events):
                if script.drop_after_events == index:
                    assert request.transport is not None
                    request.transport.close()
                    self.outcomes.append("dropped")
                    return response
                if script.inject_after_events == index:
                    await response.write(script.inject)
                if script.stall_after_events == index:
                    self.stalled_at.append(asyncio.get_running_loop().time())
                    if script.stall_until is not None:
                        await script.stall_until.wait()
                    else:
                        await asyncio.sleep(script.stall_seconds)
                for piece in _pieces(event, script.chunk_size):
                    await response.write(piece)
                    if script.delay:
                        await asyncio.sleep(script.delay)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.outcomes.append("aborted")
            raise
        self.outcomes.append("complete")
        return response


def _pieces(data: bytes, size: int | None) -> list[bytes]:
    if size is None:
        return [data]
    return [data[i : i + size] for i in range(0, len(data), size)]
