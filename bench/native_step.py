"""Instructions per steady event: the native step (proxy/core/steady) beside the Python path.

    .venv/bin/python bench/native_step.py                 # under callgrind (needs valgrind)
    .venv/bin/python bench/native_step.py --plain         # CPU time of the same loops, no valgrind

32 streams of bench/paced.py's vLLM completions events (`token_ids`, one token per event, the
`logprobs` object the proxy asks for), fed round-robin, one event per chunk per read, after each
stream's first event. Measured per steady event:

* body: `CodecBody.feed(event)` (the Python body: SSE split, JSON, the IDs checked against the
  text, the msgpack frame) against `Step.feed(chunk)` (the same, plus the chunk framing undone
  and the client's chunk framing added);
* read: the data plane's whole steady read, `UpstreamConnection.data_received(chunk)` to the
  client write: llhttp, the body and the stream's framing and accounting, against the native
  step and its write; and the same for pass-through.

Under callgrind each loop runs inside its own C iterator (`itertools.starmap`, `filterfalse`,
`dropwhile`, `takewhile`), whose inclusive instruction count is the loop's and nothing else:
set-up (the tokenizer, the texts) is not counted. A loop's count includes the harness's call
into it, a few hundred instructions, the same on both sides (the `noop` row).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.paced import make_texts  # noqa: E402
from bench.paced_upstream import chunk, render_events  # noqa: E402
from proxy import assets  # noqa: E402
from proxy.core.bodies import CodecBody, RelayedBody  # noqa: E402
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter  # noqa: E402
from proxy.core.compression.compressors import new_compressor  # noqa: E402
from proxy.core.guard import StreamGuard  # noqa: E402
from proxy.core.http.versioning import V0_4  # noqa: E402
from proxy.core.steady import NATIVE  # noqa: E402
from proxy.core.steady.bodies import native_body  # noqa: E402
from proxy.core.stream.chunks import parse_completion_chunk  # noqa: E402
from proxy.core.stream.transcode import CodecTranscoder  # noqa: E402
from proxy.core.wire.frames import encoder_for  # noqa: E402
from proxy.server.data.upstream_protocol import UpstreamConnection  # noqa: E402
from proxy.tokenizers import load_tokenizer  # noqa: E402
from proxy.tokenizers.vocabulary import Vocabulary  # noqa: E402

STREAMS = 32
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, float("inf"))
# Each loop's C iterator: callgrind's inclusive count of it is the loop's.
LOOPS = {
    "codec body, Python": "starmap_next",
    "codec body, native step": "filterfalse_next",
    "codec read, Python path": "dropwhile_next",
    "codec read, native path": "takewhile_next",
    "relay read, Python path": "dropwhile_next",
    "relay read, native path": "takewhile_next",
    "noop": "starmap_next",
}
GROUPS = {
    "codec": ["codec body, Python", "codec body, native step", "codec read, Python path",
              "codec read, native path"],
    "relay": ["relay read, Python path", "relay read, native path"],
    "noop": ["noop"],
}  # fmt: skip
_discard: collections.deque[bytes] = collections.deque(maxlen=0)
write = _discard.append  # the client transport: bytes go nowhere


class Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


class Sink:
    """`ResponseStream.on_data`'s steady path: feed (or pass), frame, write, account."""

    def __init__(self, body: CodecBody | RelayedBody) -> None:
        self.body = body
        self.passes = body.passes_through
        self.bytes_out = 0
        self.counts = [0] * len(BOUNDS)
        self.total = 0.0
        self.last = time.monotonic()

    def on_data(self, data: bytes) -> None:
        out = data if self.passes else self.body.feed(data, 0.0)
        if out:
            write(b"%x\r\n%b\r\n" % (len(out), out))
            self.bytes_out += len(out)
            now = time.monotonic()
            gap = now - self.last
            self.counts[bisect_left(BOUNDS, gap)] += 1
            self.total += gap
            self.last = now

    def on_end(self) -> None:
        pass

    def on_error(self, exc: Exception) -> None:
        raise exc


def codec_body(vocabulary: Vocabulary) -> CodecBody:
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_completion_chunk,
        token_ids="auto",
        token_bytes=vocabulary.token_bytes,
    )
    writer = BodyWriter(encoder_for("msgpack"), new_compressor("identity", None), IDENTITY_FLUSH)
    return CodecBody(StreamGuard(transcoder, V0_4), writer)


async def connection(first: bytes, sink: Sink, native: bool) -> UpstreamConnection:
    """A connection whose head and first event are in, the sink streaming."""
    conn = UpstreamConnection(asyncio.get_running_loop(), lambda: None)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    head = asyncio.ensure_future(conn.request(b"POST / HTTP/1.1\r\n\r\n", None, head_only=False))
    await asyncio.sleep(0)
    conn.data_received(HEAD)
    await head
    conn.attach(sink)
    conn.data_received(first)
    if native:
        binding = native_body(sink.body)
        assert binding is not None
        conn.want_native()
        step = conn.steady
        assert step is not None, "the step did not take the body over"
        assert binding.arm(step, time.monotonic(), time.monotonic, BOUNDS), "not steady"
        conn.steady_to(write)
    return conn


def streams(path: Path) -> list[list[bytes]]:
    texts = json.loads(path.read_text())
    out = []
    for index, text in enumerate(texts):
        from bench.paced_upstream import Text

        events = render_events(
            Text.from_json(text), index, max_tokens=None, token_ids=True, logprobs=1
        )
        out.append([chunk(event) for event in events[:-2]])  # not the finish and [DONE]
    return out


def interleaved(per_stream: list[list[Any]], rounds: int) -> list[Any]:
    return [per_stream[s][r] for r in range(rounds) for s in range(len(per_stream))]


def dechunked(data: bytes) -> bytes:
    return data[data.index(b"\r\n") + 2 : -2]


async def loops(group: str, path: Path, rounds: int) -> dict[str, Callable[[], None]]:
    """The loops of one group, ready to run (each over 32 × rounds steady events)."""
    vocabulary = Vocabulary.build(load_tokenizer(assets.SMOLLM2_GGUF.ensure()))
    chunks = streams(path)
    out: dict[str, Callable[[], None]] = {}
    if group == "noop":
        work = [(None, None)] * (STREAMS * rounds)
        out["noop"] = lambda: _drain(itertools.starmap(lambda a, b: None, work))
        return out
    if group == "codec":
        bodies = [codec_body(vocabulary) for _ in chunks]
        for body, events in zip(bodies, chunks, strict=True):
            body.feed(dechunked(events[0]), 0.0)
        feeds = [(body.feed, dechunked(c), 0.0) for body, c in zip(
            itertools.cycle(bodies), interleaved([e[1:] for e in chunks], rounds))]  # fmt: skip
        out["codec body, Python"] = lambda: _drain(
            itertools.starmap(lambda feed, data, now: feed(data, now), feeds)
        )
        steps = []
        for events in chunks:
            sink = Sink(codec_body(vocabulary))
            conn = await connection(events[0], sink, native=True)
            assert conn.steady is not None
            steps.append(conn.steady.feed)
        step_items = list(zip(itertools.cycle(steps), interleaved([e[1:] for e in chunks], rounds)))
        out["codec body, native step"] = lambda: _drain(
            itertools.filterfalse(lambda item: item[0](item[1]) is None, step_items)
        )
    sinks_python = [
        Sink(codec_body(vocabulary) if group == "codec" else RelayedBody()) for _ in chunks
    ]
    sinks_native = [
        Sink(codec_body(vocabulary) if group == "codec" else RelayedBody()) for _ in chunks
    ]
    python = [
        await connection(e[0], s, native=False) for e, s in zip(chunks, sinks_python, strict=True)
    ]
    native = [
        await connection(e[0], s, native=True) for e, s in zip(chunks, sinks_native, strict=True)
    ]
    reads = interleaved([e[1:] for e in chunks], rounds)
    python_items = [(c.data_received, r) for c, r in zip(itertools.cycle(python), reads)]
    native_items = [(c.data_received, r) for c, r in zip(itertools.cycle(native), reads)]
    out[f"{group} read, Python path"] = lambda: _drain(
        itertools.dropwhile(lambda item: item[0](item[1]) is None, python_items)
    )
    out[f"{group} read, native path"] = lambda: _drain(
        itertools.takewhile(lambda item: item[0](item[1]) is None, native_items)
    )

    def every_read_was_the_steps() -> None:
        for conn in native:
            assert conn.steady is not None, "dropped"
            assert conn.steady.steady_reads == rounds, (conn.steady.steady_reads, rounds)

    out["check"] = every_read_was_the_steps
    return out


def _drain(iterator: Iterable[Any]) -> None:
    collections.deque(iterator, maxlen=0)


def child(group: str, path: Path, rounds: int, plain: bool) -> None:
    built = asyncio.run(loops(group, path, rounds))
    check = built.pop("check", None)
    for name, run in built.items():
        started = time.thread_time()
        run()
        elapsed = time.thread_time() - started
        if plain:
            print(f"{name}: {elapsed / (STREAMS * rounds) * 1e6:.2f} µs per event (CPU)")
    if check is not None:
        check()


def inclusive(out_file: Path, function: str) -> int:
    """`function`'s inclusive instruction count, from callgrind_annotate."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out_file)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in text.splitlines():
        if re.search(rf"\b{function}\b", line):
            return int(line.split()[0].replace(",", ""))
    raise LookupError(f"{function} not in {out_file}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="events per stream measured")
    parser.add_argument("--plain", action="store_true", help="CPU time, no valgrind")
    parser.add_argument("--child", nargs=2, metavar=("GROUP", "TEXTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if NATIVE is None:
        raise SystemExit("the native steady path is not built (or CODEC_PROXY_NO_EXTENSIONS)")
    if args.child:
        child(args.child[0], Path(args.child[1]), args.rounds, args.plain)
        return
    vocabulary = Vocabulary.build(load_tokenizer(assets.SMOLLM2_GGUF.ensure()))
    texts = make_texts(vocabulary, args.rounds + 8, STREAMS)
    scratch = Path(tempfile.mkdtemp(prefix="native-step-"))
    path = scratch / "texts.json"
    path.write_text(json.dumps([text.to_json() for text in texts]))
    events = STREAMS * args.rounds
    for group, names in GROUPS.items():
        command = [
            sys.executable,
            __file__,
            "--rounds",
            str(args.rounds),
            "--child",
            group,
            str(path),
        ]
        if args.plain:
            subprocess.run([*command, "--plain"], check=True)
            continue
        out_file = scratch / f"callgrind-{group}.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *command],
            check=True, capture_output=True,
        )  # fmt: skip
        for name in names:
            count = inclusive(out_file, LOOPS[name])
            print(f"{name}: {count / events:,.0f} instructions per event", flush=True)


if __name__ == "__main__":
    main()
