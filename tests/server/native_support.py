"""Driving one upstream connection's body through a response body, as the data plane does,
with or without the native step: what the differential tests compare.

`Mirror` is what `ResponseStream` (proxy/server/data/stream.py) does with a body once it has
an upstream connection, reduced to its calls: feed until ready, then one feed and one framed
write per read, the native step armed after the first frame and after each read it declined,
its counters folded before the body is used again. The connection is the real one
(`UpstreamConnection`), fed reads by hand.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from proxy.core.bodies import CodecBody, ResponseBody
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter
from proxy.core.compression.compressors import new_compressor
from proxy.core.compression.flush import FlushConfig
from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4
from proxy.core.steady.bodies import NativeBody, native_body
from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.token_source import ReportedIds, TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder, StreamOutcome
from proxy.core.wire.frames import PrefixedMsgpackFrameEncoder, encoder_for
from proxy.server.data.upstream_protocol import UpstreamConnection
from proxy.tokenizers.vocabulary import Vocabulary

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FORMATS = ("msgpack", "msgpack-delta", "protobuf", "prefixed", "msgpack+gzip", "msgpack-delta+br")
FIRST_READ_SLICE = 4096  # stream.py's
MAX_EVENT_BYTES = 1 << 20
INF = float("inf")


class Transport:
    """A transport that keeps nothing: the connection only writes its request to it."""

    def __init__(self) -> None:
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def codec_body(
    vocabulary: Vocabulary, *, chat: bool, fmt: str, token_ids: TokenIdMode = "auto"
) -> CodecBody:
    """A Codec body as control/codec.py makes it for an identity response."""
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_chat_chunk if chat else parse_completion_chunk,
        max_event_bytes=MAX_EVENT_BYTES,
        token_ids=token_ids,
        token_bytes=vocabulary.token_bytes,
    )
    name, _, coding = fmt.partition("+")
    encoder = PrefixedMsgpackFrameEncoder() if name == "prefixed" else encoder_for(name)
    if coding:  # a compressed body: frames wait for a window of 16 (no time passes here)
        flush = FlushConfig(interval_ms=50, max_frames=16)
        writer = BodyWriter(encoder, new_compressor(coding, None), flush)  # type: ignore[arg-type]
    else:
        writer = BodyWriter(encoder, new_compressor("identity", None), IDENTITY_FLUSH)
    return CodecBody(StreamGuard(transcoder, V0_4), writer)


@dataclass
class Mirror:
    """The stream's side (a `BodySink`), writing into `wire` what the client would receive."""

    conn: UpstreamConnection
    body: ResponseBody
    native: NativeBody | None
    wire: list[bytes] = field(default_factory=list)
    streaming: bool = False
    ended: str | None = None
    bytes_out: int = 0
    writes: int = 0
    gaps: int = 0
    last_write: float | None = None
    step: Any = None
    clock: float = 0.0
    rest: list[bytes] = field(default_factory=list)
    pending_end: bool = False

    def time(self) -> float:
        self.clock += 0.001
        return self.clock

    # --- BodySink --------------------------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        if self.ended is not None:
            return
        if not self.streaming:
            # Before the response starts: fed until ready, the rest kept for `start`.
            while data and not self.body.ready:
                self._write(self.body.feed(data[:FIRST_READ_SLICE], 0.0))
                data = data[FIRST_READ_SLICE:]
            if data:
                self.rest.append(data)
            return
        self._fold()
        try:
            out = data if self.body.passes_through else self.body.feed(data, 0.0)
        except Exception as exc:  # stream.py's `_failed`/`_crashed`: the body ends
            self._end(self.body.fail(f"upstream failed mid-stream: {exc}", 0.0), "failed")
            return
        if self.body.done:
            self._end(out, "complete")
            return
        self._write(out)
        self._arm()

    def start(self) -> None:
        """The response started (stream.py's `_resume`): what was kept, then the step."""
        self.streaming = True
        rest, self.rest = self.rest, []
        for data in rest:
            self.on_data(data)
        if self.pending_end:
            self.on_end()
        elif self.ended is None:
            self._arm()

    def on_end(self) -> None:
        if not self.streaming:
            self.pending_end = True
            return
        self._fold()
        if self.ended is None:
            self._end(self.body.flush(0.0), "complete")

    def on_error(self, exc: Exception) -> None:
        if not self.streaming:
            self.ended = "failed before the response"
            return
        self._fold()
        if self.ended is None:
            self._end(self.body.fail(f"upstream failed mid-stream: {exc}", 0.0), "failed")

    # --- the stream's own ------------------------------------------------------------------

    def _arm(self) -> None:
        native = self.native
        if native is None or self.last_write is None or not self.streaming:
            return
        if native.hopeless:
            self._fold()
            self.native = None
            return
        step = self.conn.steady
        armed = step is not None and native.arm(step, self.last_write, self.time, (0.5, INF))
        if armed and self.step is None:
            self.step = step
            self.conn.steady_to(self.on_made if native.hands else self.wire.append)

    def on_made(self, handed: tuple[int, ...] | str) -> None:
        assert self.native is not None
        out = self.native.made(handed, 0.0)
        if self.body.done:
            self._end(out, "complete")
        else:
            self._write(out)

    def _fold(self) -> None:
        if self.native is None or self.step is None:
            return
        writes = self.native.fold(self.step)
        self.bytes_out += writes.bytes_out
        self.gaps += sum(writes.gap_counts)
        if writes.bytes_out:
            self.last_write = writes.last_write
            self.writes += 1

    def _write(self, data: bytes) -> None:
        if not data:
            return
        self.wire.append(b"%x\r\n%b\r\n" % (len(data), data))
        self.bytes_out += len(data)
        if self.last_write is not None:
            self.gaps += 1
        self.last_write = self.time()

    def _end(self, tail: bytes | None, how: str) -> None:
        self.ended = how
        if tail is None:
            return
        if tail:
            self._write(tail)
        self.wire.append(b"0\r\n\r\n")
        self.conn.detach()


@dataclass(frozen=True)
class Result:
    """Everything the client and the proxy's accounting see of one stream."""

    wire: bytes
    ended: str | None
    outcome: StreamOutcome | None
    counters: tuple[int, ...]
    native_reads: int


def counters(body: ResponseBody, mirror: Mirror, conn: UpstreamConnection) -> tuple[int, ...]:
    counted = [mirror.bytes_out, conn.received]
    if isinstance(body, CodecBody):
        transcoder = body.guard.source
        assert isinstance(transcoder, CodecTranscoder)
        source = transcoder._source
        encoder = body._writer.encoder
        counted += [
            transcoder.tokens,
            body.guard._sent,
            source._ids._base if isinstance(source, ReportedIds) else -1,
            getattr(encoder, "_base", -1),
        ]
    return tuple(counted)


async def drive(body: ResponseBody, reads: list[bytes], *, native: bool, cut: bool) -> Result:
    """`reads` (the head in the first) into a real connection; `cut`: the connection is lost
    after the last one."""
    loop = asyncio.get_running_loop()
    conn = UpstreamConnection(loop, lambda: None)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    request = asyncio.ensure_future(conn.request(b"POST / HTTP/1.1\r\n\r\n", None, head_only=False))
    await asyncio.sleep(0)
    reads = list(reads)
    while not request.done() and reads:
        conn.data_received(reads.pop(0))
        await asyncio.sleep(0)
    mirror = Mirror(conn, body, native_body(body) if native else None)
    if request.done() and request.exception() is None:
        conn.attach(mirror)
        if mirror.native is not None:
            conn.want_native()
        for data in reads:
            if mirror.body.ready or mirror.ended is not None:
                break
            reads = reads[1:]
            conn.data_received(data)
        if mirror.ended is None:
            mirror.start()
        for data in reads:
            conn.data_received(data)
            if mirror.ended is not None:
                break
        if cut and mirror.ended is None:
            conn.connection_lost(None)
    else:
        request.cancel()
    step = mirror.step
    outcome = body.guard.outcome if isinstance(body, CodecBody) else None
    return Result(
        b"".join(mirror.wire),
        mirror.ended,
        outcome,
        counters(body, mirror, conn),
        step.steady_reads if step is not None else 0,
    )


# --- streams -----------------------------------------------------------------------------------


def framed(events: list[bytes], rng: random.Random, *, odd: bool) -> bytes:
    """The body as chunks: mostly one per event (as backends write), some merged or split,
    and with `odd`, framing the native step leaves to llhttp (extensions, upper-case or padded
    sizes, trailers)."""
    out = bytearray()
    index = 0
    while index < len(events):
        take = 1 if rng.random() < 0.8 else rng.randint(1, 3)
        data = b"".join(events[index : index + take])
        index += take
        pieces = [data]
        if len(data) > 2 and rng.random() < 0.1:
            cut = rng.randint(1, len(data) - 1)
            pieces = [data[:cut], data[cut:]]
        for piece in pieces:
            size = b"%x" % len(piece)
            if odd and rng.random() < 0.05:
                size = rng.choice([size.upper(), b"0" + size, size + b";ext=1"])
            out += size + b"\r\n" + piece + b"\r\n"
    out += b"0\r\nx-trailer: 1\r\n\r\n" if odd and rng.random() < 0.3 else b"0\r\n\r\n"
    return bytes(out)


def split(wire: bytes, rng: random.Random, boundaries: list[int]) -> list[bytes]:
    """Reads as a network would cut them: mostly at chunk boundaries, sometimes anywhere, the
    head alone or with the first chunks."""
    cuts = sorted(
        {b for b in boundaries if rng.random() < 0.7}
        | {rng.randint(1, len(wire) - 1) for _ in range(rng.randint(0, max(1, len(wire) // 400)))}
    )
    reads, start = [], 0
    for cut in cuts:
        if start < cut < len(wire):
            reads.append(wire[start:cut])
            start = cut
    reads.append(wire[start:])
    return reads


def chunk_boundaries(wire: bytes) -> list[int]:
    """Offsets in `wire` (head and chunks) where a chunk starts."""
    at = wire.index(b"\r\n\r\n") + 4
    out = [at]
    while True:
        line_end = wire.find(b"\r\n", at)
        if line_end < 0:
            return out
        try:
            size = int(wire[at:line_end].split(b";")[0], 16)
        except ValueError:
            return out
        if size == 0:
            return out
        at = line_end + 2 + size + 2
        out.append(at)


def mutated(wire: bytes, rng: random.Random) -> bytes:
    """One byte flipped, inserted or removed, in the body."""
    start = wire.index(b"\r\n\r\n") + 4
    at = rng.randrange(start, len(wire))
    kind = rng.random()
    if kind < 0.6:
        byte = (
            rng.choice(b'"\\{}[]:,0123456789\r\n \x00\xff\xc3tfnu-.eE')
            if rng.random() < 0.7
            else rng.randrange(256)
        )
        return wire[:at] + bytes((byte,)) + wire[at + 1 :]
    if kind < 0.8:
        return wire[:at] + bytes((rng.randrange(256),)) + wire[at:]
    return wire[:at] + wire[at + 1 :]


def vllm_event(text: str, ids: list[int], *, chat: bool, logprobs: bool = False) -> bytes:
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=None, stop_reason=None, token_ids=ids)
    if logprobs:
        choice["logprobs"] = {"tokens": [text], "token_logprobs": [-0.5], "top_logprobs": None}
    chunk = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }
    return (
        b"data: " + json.dumps(chunk, ensure_ascii=bool(ids) and ids[0] % 2 == 0).encode() + b"\n\n"
    )


def llamacpp_event(text: str, ids: list[int], *, chat: bool) -> bytes:
    content = [
        {"id": i, "token": "t", "bytes": [1], "logprob": -0.1, "top_logprobs": []} for i in ids
    ]
    choice: dict[str, Any] = {"index": 0, "logprobs": {"content": content}, "finish_reason": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    chunk = {
        "choices": [choice],
        "created": 1,
        "model": "m",
        "object": "text_completion",
        "id": "x",
    }
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
