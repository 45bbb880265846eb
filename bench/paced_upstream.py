"""The paced fake backend of bench/paced.py: one token per SSE event, one event per write.

    python -m bench.paced_upstream --streams-file FILE --port PORT [--pace-ms 20]
        [--schedule batched|spread] [--no-logprobs]

It answers `POST /v1/completions` in vLLM's streamed shape (`text_completion` chunks with
`stop_reason`, `prompt_token_ids` and `token_ids`; the last token's chunk carries
`finish_reason: "length"`; then `data: [DONE]`). With `return_token_ids: true` (the proxy asks
for it when `--token-ids` is `auto` or `backend`) every chunk carries the IDs of its token, and
with `logprobs: N` (the proxy asks for 1, for llama.cpp's sake) vLLM's completions `logprobs`
object; otherwise those fields are null, as vLLM sends them.

What a stream says comes from FILE, written by bench/paced.py: texts of natural text cut into
per-token deltas by the proxy's tokenizer, with the IDs of each delta. The request's
`prompt`, `"paced:<n>"`, picks text `n % len(texts)`; `max_tokens` cuts it. Every response is
a function of the request alone (the `id` is `cmpl-paced-<n>`, `created` is fixed), so the
same request gets the same bytes straight from here and through any relay.

Pacing. The first token leaves as soon as the request is read (no prefill), then one event
every `pace` per stream. `spread`: at the stream's own arrival time plus k intervals.
`batched` (the default): on a clock shared by all streams, like the decode steps of a
continuously batching server (vLLM, llama.cpp with parallel slots), so every stream in flight
writes its next event in the same step. One timer serves every stream (a heap of due times), and
each event is one `send()` with its HTTP/1.1 chunk framing. The request headers
`X-Paced-Pace-Ms` (the interval for this request) and `X-Paced-Key` (record this request's
write times under that key) are end-to-end headers, which relays forward.

`GET /sent?prefix=P` returns, and forgets, the recorded streams whose key starts with P:
for each, the wall-clock time (`time.time_ns()`, CLOCK_REALTIME, the clock the kernel stamps
received packets with) each event was written, and the time it was due. `GET /health` answers
200. It is plain asyncio, no HTTP framework: at a thousand streams every microsecond it spends
per event is one the proxy and the client do not get on a small machine. It runs in a process
of its own, so its CPU time is nobody else's.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

Schedule = Literal["batched", "spread"]

KEY_HEADER = "x-paced-key"
PACE_HEADER = "x-paced-pace-ms"
MODEL = "smollm2"
CREATED = 1795977989
# What vLLM reports as the prompt's IDs in the first chunk: the proxy ignores them, but they are
# part of the bytes it reads.
PROMPT_TOKEN_IDS = (31530, 549, 563, 7042, 15107, 232, 227)
RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"server: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n"
    b"\r\n"
)
DONE_EVENT = b"data: [DONE]\n\n"
LAST_CHUNK = b"0\r\n\r\n"
# A timer may fire this early: epoll waits in whole milliseconds, so a wake-up a little before
# the due time would otherwise cost a whole extra millisecond.
EARLY_NS = 200_000


@dataclass(frozen=True)
class Text:
    """One stream's content: its text as per-token deltas, each with the IDs it carries."""

    deltas: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Text:
        return cls(tuple(value["deltas"]), tuple(tuple(ids) for ids in value["ids"]))

    def to_json(self) -> dict[str, Any]:
        return {"deltas": list(self.deltas), "ids": [list(ids) for ids in self.ids]}


def load_texts(path: Path) -> list[Text]:
    return [Text.from_json(value) for value in json.loads(path.read_text())["texts"]]


def stream_index(prompt: object) -> int:
    if not isinstance(prompt, str) or not prompt.startswith("paced:"):
        raise ValueError(f"prompt must be 'paced:<n>', not {prompt!r}")
    return int(prompt.removeprefix("paced:"))


def _fake_logprob(token_id: int) -> float:
    # Deterministic, and as long as the floats a real server prints.
    return -((token_id * 2654435761) % 999_983) / 174_321.0


def _logprobs(delta: str, ids: Sequence[int], offset: int) -> dict[str, Any]:
    # vLLM's completions shape. Its `tokens` are each token's own text; a delta here is the
    # text of all its IDs (one, unless a character spans tokens), which is close enough.
    values = [_fake_logprob(token_id) for token_id in ids]
    tokens = [delta if i == len(ids) - 1 else "" for i in range(len(ids))]
    return {
        "text_offset": [offset] * len(ids),
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": [{token: value} for token, value in zip(tokens, values, strict=True)],
    }


def render_events(
    text: Text,
    index: int,
    *,
    max_tokens: int | None,
    token_ids: bool,
    logprobs: int | None,
) -> list[bytes]:
    """The SSE events of one response, in order, `[DONE]` last: the bytes a client must get.

    One event per delta (one token, or the tokens of one split character), at most
    `max_tokens` tokens; the last token's event carries `finish_reason: "length"`.
    """
    prefix = (
        f'data: {{"id":"cmpl-paced-{index}","object":"text_completion","created":{CREATED},'
        f'"model":"{MODEL}","choices":[{{"index":0,"text":'
    )
    events = []
    tokens = offset = 0
    for number, (delta, ids) in enumerate(zip(text.deltas, text.ids, strict=True)):
        tokens += len(ids)
        last = number == len(text.deltas) - 1 or (max_tokens is not None and tokens >= max_tokens)
        lp = _logprobs(delta, ids, offset) if logprobs is not None else None
        prompt_ids = list(PROMPT_TOKEN_IDS) if token_ids and number == 0 else None
        body = (
            json.dumps(delta, ensure_ascii=False)
            + ',"logprobs":'
            + json.dumps(lp, ensure_ascii=False, separators=(",", ":"))
            + ',"finish_reason":'
            + ('"length"' if last else "null")
            + ',"stop_reason":null,"prompt_token_ids":'
            + json.dumps(prompt_ids, separators=(",", ":"))
            + ',"token_ids":'
            + (json.dumps(list(ids), separators=(",", ":")) if token_ids else "null")
            + "}]}\n\n"
        )
        events.append((prefix + body).encode())
        offset += len(delta)
        if last:
            break
    events.append(DONE_EVENT)
    return events


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


# --- pacing ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Active:
    """One response being streamed."""

    conn: Connection
    chunks: list[bytes]  # token events, framed; the last also carries [DONE] and the end
    arrival: int  # time_ns when the request was read
    pace: int  # ns
    key: str | None
    next: int = 0
    sent: list[int] = field(default_factory=list)
    due: list[int] = field(default_factory=list)


class Pacer:
    """Writes every stream's next event when it is due, off one timer."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.epoch = time.time_ns()  # the shared clock's step 0 (batched)
        self._heap: list[tuple[int, int, Active]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0
        self.recorded: dict[str, dict[str, list[int]]] = {}

    def due(self, active: Active, k: int) -> int:
        if k == 0:
            return active.arrival
        at = active.arrival + k * active.pace
        if self.schedule == "spread":
            return at
        steps = -(-(at - self.epoch) // active.pace)  # the first step at or after `at`
        return self.epoch + steps * active.pace

    def start(self, active: Active) -> None:
        self._push(active, self.due(active, 0))

    def _push(self, active: Active, due: int) -> None:
        active.due.append(due)
        heapq.heappush(self._heap, (due, next(self._order), active))
        if self._timer is None or due < self._armed_for:
            self._arm(due)

    def _arm(self, due: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._armed_for = due
        self._timer = loop.call_at(loop.time() + (due - time.time_ns()) / 1e9, self._tick)

    def _tick(self) -> None:
        self._timer = None
        heap = self._heap
        while heap and heap[0][0] <= time.time_ns() + EARLY_NS:
            _, _, active = heapq.heappop(heap)
            self._write(active)
        if heap:
            self._arm(heap[0][0])

    def _write(self, active: Active) -> None:
        if active.conn.closed:
            return
        active.sent.append(time.time_ns())
        active.conn.transport.write(active.chunks[active.next])
        active.next += 1
        if active.next < len(active.chunks):
            self._push(active, self.due(active, active.next))
            return
        if active.key is not None:
            self.recorded[active.key] = {"sent": active.sent, "due": active.due}
        active.conn.finished()

    def take(self, prefix: str) -> dict[str, dict[str, list[int]]]:
        found = {k: v for k, v in self.recorded.items() if k.startswith(prefix)}
        for key in found:
            del self.recorded[key]
        return found


# --- HTTP/1.1 --------------------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One client connection: requests in turn (keep-alive), one streamed response at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = bytearray()
        self.busy = False
        self.closed = False
        self.close_after = False
        self.transport: asyncio.WriteTransport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def finished(self) -> None:
        """The streamed response is complete: close, or read the next request."""
        self.busy = False
        if self.close_after:
            self.transport.close()
        else:
            self._next_request()

    def _next_request(self) -> None:
        while not self.busy and not self.closed:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                self._reply(411, {"error": "chunked request bodies are not supported"})
                self.transport.close()
                return
            length = int(headers.get("content-length", "0"))
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            connection = headers.get("connection", "").lower()
            self.close_after = "close" in connection or (
                version == "HTTP/1.0" and "keep-alive" not in connection
            )
            if self._handle(method, target, headers, body):
                return  # streaming: finished() reads on
            if self.close_after:
                self.transport.close()
                return

    def _reply(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        reason = {200: "OK", 404: "Not Found", 400: "Bad Request", 411: "Length Required"}
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason.get(status, "Error").encode(), len(body), body)
        )

    def _handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> bool:
        """Answer one request; True when a streamed response has started."""
        url = urlsplit(target)
        if method == "GET" and url.path == "/health":
            self._reply(200, {"status": "ok"})
        elif method == "GET" and url.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif method == "GET" and url.path == "/sent":
            prefix = parse_qs(url.query).get("prefix", [""])[0]
            self._reply(200, self.server.pacer.take(prefix))
        elif method == "POST" and url.path == "/v1/completions":
            try:
                self._stream(headers, json.loads(body))
                return True
            except (ValueError, KeyError, TypeError) as exc:
                self._reply(400, {"error": {"message": str(exc), "type": "BadRequestError"}})
        else:
            self._reply(404, {"error": f"no route {method} {url.path}"})
        return False

    def _stream(self, headers: dict[str, str], request: dict[str, Any]) -> None:
        index = stream_index(request.get("prompt"))
        logprobs = request.get("logprobs")
        events = render_events(
            self.server.texts[index % len(self.server.texts)],
            index,
            max_tokens=request.get("max_tokens"),
            token_ids=request.get("return_token_ids") is True,
            logprobs=logprobs if isinstance(logprobs, int) and self.server.logprobs else None,
        )
        # The final chunk's event, [DONE] and the end of the body leave together, right after
        # the last token as vLLM and llama.cpp send them. Only token events are paced.
        chunks = [chunk(event) for event in events[:-1]]
        chunks[-1] += chunk(events[-1]) + LAST_CHUNK
        pace = headers.get(PACE_HEADER)
        active = Active(
            self,
            chunks,
            arrival=time.time_ns(),
            pace=round(float(pace) * 1e6) if pace else self.server.pace,
            key=headers.get(KEY_HEADER),
        )
        self.busy = True
        self.transport.write(RESPONSE_HEAD)
        self.server.pacer.start(active)


@dataclass
class Server:
    texts: list[Text]
    pace: int  # ns
    logprobs: bool
    pacer: Pacer


async def serve(args: argparse.Namespace) -> None:
    server = Server(
        load_texts(args.streams_file),
        round(args.pace_ms * 1e6),
        not args.no_logprobs,
        Pacer(args.schedule),
    )
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        lambda: Connection(server), "127.0.0.1", args.port, backlog=4096
    )
    print(
        f"listening http://127.0.0.1:{args.port} ({len(server.texts)} texts, "
        f"{args.pace_ms:g} ms, {args.schedule})",
        flush=True,
    )
    async with listener:
        await listener.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams-file", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--schedule", choices=("batched", "spread"), default="batched")
    parser.add_argument(
        "--no-logprobs", action="store_true", help="answer `logprobs` requests with null"
    )
    args = parser.parse_args(argv)
    # SIGTERM (bench/_common.py's Child.stop) ends the process with the default action.
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
