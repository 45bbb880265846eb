"""At the pace real backends stream: one token per SSE event, many streams, 20 ms apart.

    .venv/bin/python bench/paced.py                       # 32 streams x 256 tokens, 20 ms
    .venv/bin/python bench/paced.py --levels 1,32,200,1000
    .venv/bin/python bench/paced.py --quick               # smoke run (under a minute)

A real backend sends one token per SSE event and one event per write, tens of milliseconds
apart per stream, to many streams at once. That, not a flat-out replay, is what a relay spends
its CPU on in production: one wake-up, one read and one write per token per stream. Three kinds
of process, on one machine, loopback only:

- the upstream: bench/paced_upstream.py in its own process. It answers in vLLM's streamed
  shape, one token per event, every `--pace-ms` per stream (by default on a step clock shared
  by all streams, as a batching server decodes), with per-chunk `token_ids` when the request
  has `return_token_ids: true`. It records when it wrote each event;
- the relay, started fresh for each scenario and measured as a process tree from /proc:
  nothing (`direct`), Debian's nginx (`nginx`; generated config: one worker,
  `proxy_buffering off`, `proxy_http_version 1.1`, upstream `keepalive`), or the proxy,
  `python -m proxy serve` (one worker, defaults otherwise);
- the client: this process. Each stream is a plain socket with SO_TIMESTAMPNS, so every read
  carries the time the kernel queued its last byte: when the client *could* decode it,
  whatever this busy process was doing then.

Scenarios (`--scenarios`): `direct` (client to upstream, JSON-SSE), `nginx` (JSON through
nginx), `passthrough` (JSON through the proxy), `backend-ids` (Codec msgpack, the IDs the
upstream reported), `retokenized` (Codec msgpack from a proxy started with
`--token-ids retokenize`), `gzip` (`backend-ids` with `Accept-Encoding: gzip`), `verify-1pct`
and `verify-all` (`backend-ids` with `--verify-sample-rate 0.01` and `1`; the other proxy
scenarios run with verification off, so the three differ only in it), `traced` (`backend-ids`
exporting OpenTelemetry traces of every request, `OTEL_TRACES_SAMPLER=always_on`, batched every
second, to bench/otlp_sink.py in its own process, which counts the spans it gets and keeps
nothing).

The text is natural: dictionaries/corpus/smollm2-generated.txt, prose written by the bundled
SmolLM2-135M-Instruct (Apache-2.0), cut into streams of `--tokens` tokens by the same model's
tokenizer, one token per event (a character split over tokens waits for its last one, as
backends stream them).

Per level (`--levels`: concurrent streams) and scenario: a fresh relay, one request, its RSS
(the baseline), a warm-up wave of the level's streams (two tokens each: it fills the
connection pools as a steady load keeps them), then the measured wave: `N` streams, started
evenly over `--ramp-ms`, each `--tokens` tokens at the pace. Measured:

- CPU per delivered token: utime + stime of the relay's process tree (/proc/<pid>/stat),
  before and after the wave, over the tokens delivered; tokens per relay CPU-second;
- body bytes per token (HTTP body as received: compressed for gzip, chunk framing excluded);
- time to first token (TTFT): from just before the connect to the kernel's receive time of
  the read that completes the first token; and "added", its p50/p99 minus `direct`'s;
- token delay: for every token, from the moment the upstream wrote it to the kernel's receive
  time of the read that completes it at the client (a JSON event whole, a Codec frame with
  its ID). Both are CLOCK_REALTIME nanoseconds on one machine;
- RSS per stream: the relay tree's peak RSS during the wave minus the baseline, per stream.

Every response is checked. JSON bodies must equal the bytes the upstream sends for that request
(rendered here by the upstream's own code, and the same for `direct`); Codec streams must decode
(`FrameDecoder`) to exactly `tokenizer.encode(text)` of the streamed text, with one terminal
frame, last, `finish_reason: "length"`, and the `Codec-Token-Source` the scenario expects.
Missing and extra tokens are counted (multiset difference). The exit status is 1 when a check
fails. Timings are reported, never asserted. Results: bench/results/paced.json (`--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import struct
import sys
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    Child,
    Column,
    bench_cache_dir,
    cleanup_on_exit,
    git_commit,
    loadavg,
    machine_busy_seconds,
    machine_info,
    plus,
    process_cpu_seconds,
    process_rss_bytes,
    process_schedstat,
    process_tree,
    results_path,
    self_cpu_seconds,
    spawn,
    table,
    times,
    wait_http_ok,
    write_results,
)
from bench.paced_upstream import (
    KEY_HEADER,
    PACE_HEADER,
    Text,
    render_events,
)
from proxy import assets
from proxy.core.wire.decoder import FrameDecodeError, FrameDecoder
from proxy.embedded import free_port
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

CORPUS = ROOT / "dictionaries" / "corpus" / "smollm2-generated.txt"
# Streams cycle over this many distinct texts (stream n gets text n % TEXTS).
TEXTS = 64
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python does not export it
TIMESPEC = struct.Struct("qq")
ANCILLARY = socket.CMSG_SPACE(TIMESPEC.size)
READ_SIZE = 1 << 18
KiB = 1024

# "bare": bench/bare_relay.py, the floor under the proxy (bench/short.py).
Relay = Literal["none", "nginx", "bare", "proxy", "proxy-retokenize"]


@dataclass(frozen=True)
class Scenario:
    key: str
    relay: Relay
    stream_format: Literal["msgpack"] | None  # None: JSON-SSE
    coding: Literal["identity", "gzip"] = "identity"
    token_source: str | None = None  # the Codec-Token-Source header expected
    # The proxy's verify_sample_rate: the share of streams checked against the published map.
    verify: float = 0.0
    # The proxy's event_loop: its default (uvloop where installed), or asyncio's own.
    event_loop: Literal["auto", "asyncio"] = "auto"
    # Every request's spans exported to an OTLP sink (two per request: server and upstream).
    traced: bool = False


_PROXY_SCENARIOS = (
    Scenario("passthrough", "proxy", None),
    Scenario("backend-ids", "proxy", "msgpack", token_source="backend"),
    Scenario("retokenized", "proxy-retokenize", "msgpack", token_source="retokenized"),
    Scenario("gzip", "proxy", "msgpack", "gzip", token_source="backend"),
)
SCENARIOS = {
    s.key: s
    for s in (
        Scenario("direct", "none", None),
        Scenario("nginx", "nginx", None),
        *_PROXY_SCENARIOS,
        # The same on asyncio's own event loop, to show what uvloop is worth.
        *(replace(s, key=f"{s.key}-asyncio", event_loop="asyncio") for s in _PROXY_SCENARIOS),
        # The cost of continuous verification (docs/ROLLOUT.md): the default share, and all.
        Scenario("verify-1pct", "proxy", "msgpack", token_source="backend", verify=0.01),
        Scenario("verify-all", "proxy", "msgpack", token_source="backend", verify=1.0),
        # The cost of tracing (docs/DEPLOY.md "Traces"): every request sampled.
        Scenario("traced", "proxy", "msgpack", token_source="backend", traced=True),
    )
}


# --- the texts ------------------------------------------------------------------------------


def token_deltas(vocabulary: Vocabulary, ids: Sequence[int]) -> Text:
    """One delta per token, as a backend streams them; a split character waits for its end."""
    tokenizer = vocabulary.loaded.tokenizer
    deltas: list[str] = []
    groups: list[tuple[int, ...]] = []
    held: list[int] = []
    for token_id in ids:
        held.append(token_id)
        piece = tokenizer.decode(held)
        if "\ufffd" not in piece:
            deltas.append(piece)
            groups.append(tuple(held))
            held = []
    if held:
        raise ValueError("the text ends inside a character")
    return Text(tuple(deltas), tuple(groups))


def make_texts(vocabulary: Vocabulary, tokens: int, count: int) -> list[Text]:
    """`count` streams of exactly `tokens` tokens from the corpus, each one whose IDs are the
    tokenizer's own encoding of its text (what a Codec stream of that text must carry)."""
    corpus = CORPUS.read_text()
    scheme = vocabulary.scheme
    all_ids = scheme.encode(corpus, at_start=True)
    texts = []
    for number in range(count):
        start = (number * len(all_ids)) // count
        for shift in range(64):
            window = [all_ids[(start + shift + i) % len(all_ids)] for i in range(tokens + 16)]
            text = vocabulary.loaded.tokenizer.decode(window)
            ids = scheme.encode(text, at_start=True)[:tokens]
            if len(ids) < tokens:
                continue
            candidate = vocabulary.loaded.tokenizer.decode(ids)
            if "\ufffd" in candidate or scheme.encode(candidate, at_start=True) != ids:
                continue
            with contextlib.suppress(ValueError):
                text_deltas = token_deltas(vocabulary, ids)
                if "".join(text_deltas.deltas) == candidate:
                    texts.append(text_deltas)
                    break
        else:
            raise RuntimeError(f"no clean {tokens}-token cut near token {start} of the corpus")
    return texts


def texts_file(texts: list[Text], tokens: int) -> Path:
    path = bench_cache_dir() / f"paced-texts-{tokens}.json"
    path.write_text(json.dumps({"texts": [t.to_json() for t in texts]}, ensure_ascii=False))
    return path


# --- the processes --------------------------------------------------------------------------


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream paced {{
        server 127.0.0.1:{upstream_port};
        keepalive {keepalive};
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://paced;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def start_nginx(binary: str, upstream_port: int, level: int) -> tuple[Child, int]:
    prefix = bench_cache_dir() / "paced-nginx"
    prefix.mkdir(exist_ok=True)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            prefix=prefix,
            port=port,
            upstream_port=upstream_port,
            # Every stream holds a client and an upstream connection; idle upstream connections
            # are kept for all of them, as the proxy's pool keeps them.
            connections=4 * level + 1024,
            nofile=8 * level + 2048,
            keepalive=max(level, 16),
        )
    )
    args = ["-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    child = spawn("nginx", args, prefix / "stdout.log", program=Path(binary))
    wait_http_ok(child, f"http://127.0.0.1:{port}/health", timeout=30)
    return child, port


def start_proxy(
    upstream_port: int,
    gguf: Path,
    token_ids: str,
    verify: float = 0.0,
    event_loop: str = "auto",
    otlp_port: int | None = None,
    launcher: Sequence[str] = ("-m", "proxy", "serve"),
    streams: int = 0,
) -> tuple[Child, int]:
    """`launcher`: what runs `codec-proxy serve` with the arguments that follow it; `streams`:
    how many run at once, admitted all (as nginx gets connections for all of them), so that
    a level above the default `max_streams` measures relaying, not 503s."""
    port = free_port()
    args = [
        *launcher,
        "--upstream", f"http://127.0.0.1:{upstream_port}",
        "--tokenizer", str(gguf),
        "--port", str(port),
        "--token-ids", token_ids,
        # The paced upstream has no /tokenize; health checks would only add noise.
        "--drift-check", "off",
        "--health-interval", "3600",
        "--verify-sample-rate", str(verify),
        "--event-loop", event_loop,
        "--max-streams", str(max(1024, streams)),
    ]  # fmt: skip
    env = None
    if otlp_port is not None:
        args += ["--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}"]
        # Batches every second rather than every 5 s (the default): the window, which waits
        # for the wave's spans, then closes before idle upstream connections expire (4 s), as
        # the other scenarios' do. A POST costs the same whatever it holds, so this errs high.
        env = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "1000"}
    child = spawn("proxy", args, bench_cache_dir() / f"paced-proxy-{token_ids}.log", env=env)
    wait_http_ok(child, f"http://127.0.0.1:{port}/readyz", timeout=120)
    return child, port


def start_sink() -> tuple[Child, int]:
    port = free_port()
    child = spawn(
        "otlp sink", ["-m", "bench.otlp_sink", "--port", str(port)],
        bench_cache_dir() / "paced-otlp-sink.log",
    )  # fmt: skip
    wait_http_ok(child, f"http://127.0.0.1:{port}/health", timeout=30)
    return child, port


def sink_counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=10) as response:
        counts: dict[str, int] = json.loads(response.read())
    return counts


def start_profiler(
    directory: Path | None, relay: Child | None, scenario: Scenario, level: int
) -> Child | None:
    """`py-spy record` on the proxy for the measured wave (--profile): collapsed stacks."""
    if directory is None or relay is None or not scenario.relay.startswith("proxy"):
        return None
    return start_py_spy(directory / f"paced-{level}-{scenario.key}", relay.pid, rate=250)


def start_py_spy(name: Path, pid: int, *, rate: int) -> Child:
    """`py-spy record` on `pid` until SIGINT: collapsed stacks in `<name>.txt`."""
    # The virtualenv's own (`pip install py-spy`), then PATH, then `pip install --user`'s.
    beside = Path(sys.executable).with_name("py-spy")
    found = beside if beside.exists() else shutil.which("py-spy")
    program = found or Path.home() / ".local" / "bin" / "py-spy"
    name.parent.mkdir(parents=True, exist_ok=True)
    args = ["record", "--pid", str(pid), "--rate", str(rate), "--nonblocking"]
    args += ["--format", "raw", "--output", f"{name}.txt"]
    child = spawn("py-spy", args, Path(f"{name}.log"), program=Path(program))
    time.sleep(0.5)  # attached before the wave starts
    return child


def tree_cpu(pid: int) -> float:
    total = 0.0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            total += process_cpu_seconds(member)
    return total


def tree_schedstat_cpu(pid: int) -> float:
    """The same in nanoseconds (schedstat): exact, but only for threads alive when read."""
    total = 0.0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            total += process_schedstat(member)[0]
    return total


def tree_rss(pid: int) -> int:
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            total += process_rss_bytes(member)
    return total


# --- the client: one socket per stream, kernel receive times ---------------------------------


class ResponseReader:
    """HTTP/1.1 response head, then the body out of its chunked (or sized) framing."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self._state = "head"
        self._need = 0  # bytes left in the current chunk, or of a sized body

    def feed(self, data: bytes) -> bytes:
        """The body bytes `data` completes."""
        self.buffer += data
        out = bytearray()
        buf = self.buffer
        while not self.complete:
            if self._state == "head":
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
                del buf[: end + 4]
                self.status = int(lines[0].split(" ", 2)[1])
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    self.headers[name.strip().lower()] = value.strip()
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    self._state = "size"
                else:
                    self._need = int(self.headers.get("content-length", "0"))
                    self._state = "sized"
            elif self._state in ("data", "sized"):
                take = min(self._need, len(buf))
                out += buf[:take]
                del buf[:take]
                self._need -= take
                if self._need:
                    break
                if self._state == "sized":
                    self.complete = True
                else:
                    self._state = "crlf"
            elif self._state == "crlf":
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                del buf[:2]
                self._state = "size"
            elif self._state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    break
                size = int(bytes(buf[:end]).split(b";")[0], 16)
                del buf[: end + 2]
                self._need, self._state = size, ("data" if size else "trailer")
            elif self._state == "trailer":
                end = buf.find(b"\r\n")
                if end < 0:
                    break
                trailer = bytes(buf[:end])
                del buf[: end + 2]
                self.complete = not trailer
        return bytes(out)


@dataclass
class Fetched:
    index: int
    started: int  # time_ns just before connecting
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    # (kernel receive time, time this process read it, body bytes) per read
    pieces: list[tuple[int, int, bytes]] = field(default_factory=list)
    reads: int = 0
    error: str | None = None


def request_bytes(
    scenario: Scenario, port: int, index: int, tokens: int, pace_ms: float, key: str | None
) -> bytes:
    body: dict[str, Any] = {"model": "smollm2", "prompt": f"paced:{index}", "max_tokens": tokens}
    if scenario.stream_format is None:
        body["stream"] = True
    else:
        body["stream_format"] = scenario.stream_format
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = [
        "POST /v1/completions HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Accept-Encoding: {scenario.coding}",
        f"Content-Length: {len(payload)}",
        f"{PACE_HEADER}: {pace_ms:g}",
    ]
    if key is not None:
        head.append(f"{KEY_HEADER}: {key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def fetch(port: int, request: bytes, index: int, time_limit: float) -> Fetched:
    """One request on a new connection; every read kept with its kernel receive time."""
    fetched = Fetched(index, time.time_ns())
    sock = client_socket()
    try:
        async with asyncio.timeout(time_limit):
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except (OSError, TimeoutError) as exc:
        fetched.error = f"{type(exc).__name__}: {exc}"
        sock.close()
        return fetched
    try:
        return await fetch_on(sock, request, fetched, time_limit)
    finally:
        sock.close()


def client_socket() -> socket.socket:
    """A client socket whose reads carry the kernel's receive time."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def fetch_on(
    sock: socket.socket, request: bytes, fetched: Fetched, time_limit: float
) -> Fetched:
    """One request on the connected `sock` (new, or kept alive from an earlier request): its
    response read to its end, every read kept with its kernel receive time."""
    loop = asyncio.get_running_loop()
    reader = ResponseReader()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        while not done.done():
            try:
                data, ancillary, _, _ = sock.recvmsg(READ_SIZE, ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                done.set_exception(exc)
                return
            now = time.time_ns()
            if not data:
                done.set_exception(ConnectionError("connection closed before the response ended"))
                return
            kernel = now
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = TIMESPEC.unpack(value[: TIMESPEC.size])
                    kernel = seconds * 1_000_000_000 + nanoseconds
            fetched.reads += 1
            try:
                body = reader.feed(data)
            except ValueError as exc:
                done.set_exception(exc)
                return
            if body:
                fetched.pieces.append((kernel, now, body))
            if reader.complete:
                done.set_result(None)

    try:
        async with asyncio.timeout(time_limit):
            await loop.sock_sendall(sock, request)
            loop.add_reader(sock.fileno(), readable)
            try:
                await done
            finally:
                loop.remove_reader(sock.fileno())
    except (OSError, ValueError, TimeoutError) as exc:
        fetched.error = f"{type(exc).__name__}: {exc}"
    fetched.status, fetched.headers = reader.status, reader.headers
    return fetched


async def wave(
    port: int,
    requests: Sequence[bytes],
    ramp: float,
    time_limit: float,
) -> list[Fetched]:
    """Every request on its own connection, started evenly over `ramp` seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    step = ramp / len(requests)

    async def one(index: int, request: bytes) -> Fetched:
        await asyncio.sleep(max(0.0, start + index * step - loop.time()))
        return await fetch(port, request, index, time_limit)

    return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))


# --- checking one stream ---------------------------------------------------------------------


@dataclass
class Checked:
    problem: str | None
    tokens: int  # tokens the stream carries
    delivered: int  # tokens that arrived, verified or not
    lost: int
    duplicated: int
    body_bytes: int
    reads: int
    ttft: int | None  # ns
    delays: list[int]  # ns, per token
    late: list[int]  # ns the upstream wrote each event after it was due
    lag: list[int]  # ns between the kernel's receive time and this process reading it


def _sse_texts(body: bytes) -> list[str]:
    texts = []
    for event in body.split(b"\n\n"):
        data = event.strip().removeprefix(b"data: ")
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            texts.append(json.loads(data)["choices"][0]["text"])
    return texts


def _multiset_diff(expected: Sequence[object], got: Sequence[object]) -> tuple[int, int]:
    want, have = collections.Counter(expected), collections.Counter(got)
    return sum((want - have).values()), sum((have - want).values())


def check(
    scenario: Scenario,
    text: Text,
    fetched: Fetched,
    tokens: int,
    sent: dict[str, list[int]] | None,
) -> Checked:
    """Verify one response and time each of its tokens (arrival at the client, kernel time)."""
    problem = fetched.error or (f"status {fetched.status}" if fetched.status != 200 else None)
    expected_ids = [token_id for ids in text.ids for token_id in ids]
    event_of = [n for n, ids in enumerate(text.ids) for _ in ids]
    body = b"".join(piece for _, _, piece in fetched.pieces)
    # When each token became decodable: kernel time of the read that completed it.
    arrived: list[int] = []
    if scenario.stream_format is None:
        events = render_events(text, fetched.index, max_tokens=tokens, token_ids=False,
                               logprobs=None)  # fmt: skip
        expected_body = b"".join(events)
        lost = duplicated = 0
        if body != expected_body:
            lost, duplicated = _multiset_diff(text.deltas, _sse_texts(body))
            problem = problem or f"JSON body differs from the upstream's ({len(body):,} bytes)"
        delivered = len(expected_ids) - lost + duplicated
        if problem is None:
            ends = list(_cumulative(len(e) for e in events[:-1]))
            received = 0
            piece_iter = iter(fetched.pieces)
            kernel = 0
            for end, group in zip(ends, text.ids, strict=True):
                while received < end:
                    kernel, _, piece = next(piece_iter)
                    received += len(piece)
                arrived += [kernel] * len(group)
    else:
        decoder = FrameDecoder(scenario.stream_format)
        inflate = zlib.decompressobj(wbits=31) if scenario.coding == "gzip" else None
        ids: list[int] = []
        done: list[str | None] = []
        last_done = False
        try:
            for kernel, _, piece in fetched.pieces:
                data = inflate.decompress(piece) if inflate is not None else piece
                for frame in decoder.feed(data):
                    ids.extend(frame.ids)
                    arrived += [kernel] * len(frame.ids)
                    last_done = frame.done
                    if frame.done:
                        done.append(frame.finish_reason)
            decoder.flush()
        except (FrameDecodeError, zlib.error) as exc:
            problem = problem or f"undecodable: {exc}"
        lost, duplicated = _multiset_diff(expected_ids, ids)
        delivered = len(ids)
        if problem is None and ids != expected_ids:
            problem = f"{len(ids)} IDs, expected {len(expected_ids)}"
        if problem is None and (len(done) != 1 or not last_done or done[0] != "length"):
            problem = f"terminal frames {done}, last frame done: {last_done}"
        source = fetched.headers.get("codec-token-source")
        if problem is None and source != scenario.token_source:
            problem = f"Codec-Token-Source {source!r}, expected {scenario.token_source!r}"
        coding = fetched.headers.get("content-encoding", "identity")
        if problem is None and coding != scenario.coding:
            problem = f"Content-Encoding {coding!r}, expected {scenario.coding!r}"

    delays: list[int] = []
    late: list[int] = []
    if sent is not None:
        written, due = sent["sent"], sent["due"]
        late = [w - d for w, d in zip(written, due, strict=False)]
        if problem is None and len(written) == len(text.ids):
            delays = [at - written[event_of[j]] for j, at in enumerate(arrived)]
        elif problem is None:
            problem = f"the upstream recorded {len(written)} events, expected {len(text.ids)}"
    elif problem is None:
        problem = "the upstream recorded no write times for this stream"
    return Checked(
        problem,
        len(expected_ids),
        delivered,
        lost,
        duplicated,
        len(body),
        fetched.reads,
        arrived[0] - fetched.started if arrived and problem is None else None,
        delays,
        late,
        [user - kernel for kernel, user, _ in fetched.pieces],
    )


def _cumulative(values: Any) -> Any:
    total = 0
    for value in values:
        total += value
        yield total


# --- one scenario at one level ---------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return None
    return values[max(1, math.ceil(q / 100 * len(values))) - 1]


def ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


@dataclass
class Setup:
    args: argparse.Namespace
    texts: list[Text]
    gguf: Path
    upstream: Child
    upstream_port: int
    nginx: str | None
    run_tag: str


def fetch_sent(upstream_port: int, prefix: str) -> dict[str, dict[str, list[int]]]:
    url = f"http://127.0.0.1:{upstream_port}/sent?prefix={urllib.parse.quote(prefix)}"
    with urllib.request.urlopen(url, timeout=60) as response:
        recorded: dict[str, dict[str, list[int]]] = json.loads(response.read())
    return recorded


async def run_scenario(setup: Setup, scenario: Scenario, level: int) -> dict[str, Any]:
    args = setup.args
    relay: Child | None = None
    sink, sink_port = start_sink() if scenario.traced else (None, None)
    if scenario.relay == "nginx":
        assert setup.nginx is not None
        relay, port = start_nginx(setup.nginx, setup.upstream_port, level)
    elif scenario.relay in ("proxy", "proxy-retokenize"):
        mode = "retokenize" if scenario.relay == "proxy-retokenize" else "auto"
        relay, port = start_proxy(
            setup.upstream_port,
            setup.gguf,
            mode,
            scenario.verify,
            scenario.event_loop,
            sink_port,
            streams=level,
        )
    else:
        port = setup.upstream_port
    timeout = 60 + 3 * args.tokens * args.pace_ms / 1000 + args.ramp_ms / 1000
    try:
        # One request, then the baseline; then a warm-up wave (two tokens per stream, 100 ms
        # apart, all at once) that leaves every pool holding a connection per stream.
        warm = await wave(port, [request_bytes(scenario, port, 0, 2, 1, None)], 0, timeout)
        if sink_port is not None:
            # A first export sets up the exporter's HTTP session: part of the baseline.
            await asyncio.to_thread(wait_exported, sink_port, 2)
        baseline_rss = tree_rss(relay.pid) if relay is not None else 0
        warmup = [request_bytes(scenario, port, i, 2, 100, None) for i in range(level)]
        warm += await wave(port, warmup, 0, timeout)
        if sink_port is not None:
            await asyncio.to_thread(wait_exported, sink_port, 2 * (1 + level))
        warm_failed = [f.error or f"status {f.status}" for f in warm if f.error or f.status != 200]

        prefix = f"{setup.run_tag}/{level}/{scenario.key}/"
        requests = [
            request_bytes(scenario, port, i, args.tokens, args.pace_ms, f"{prefix}{i}")
            for i in range(level)
        ]
        peak_rss = baseline_rss
        sampling = True

        async def sample_rss() -> None:
            nonlocal peak_rss
            while sampling and relay is not None:
                with contextlib.suppress(OSError):
                    peak_rss = max(peak_rss, tree_rss(relay.pid))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample_rss())
        profiler = start_profiler(args.profile, relay, scenario, level)
        before = clocks(relay, setup.upstream)
        fetched = await wave(port, requests, args.ramp_ms / 1000, timeout)
        if sink_port is not None:
            # Spans are encoded and sent by the proxy's batch thread on its schedule: the
            # window ends once every one of the wave's is in, so their CPU counts.
            await asyncio.to_thread(wait_exported, sink_port, spans_of(level))
        after = clocks(relay, setup.upstream)
        sampling = False
        await sampler
        if profiler is not None:
            profiler.proc.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
            profiler.proc.wait(60)
        if relay is not None:
            peak_rss = max(peak_rss, tree_rss(relay.pid))
    finally:
        if relay is not None:
            relay.stop()  # a traced proxy exports what it holds as it stops
        spans = None
        if sink is not None and sink_port is not None:
            spans = sink_counts(sink_port)["spans"]
            sink.stop()
    sent = fetch_sent(setup.upstream_port, prefix)
    checked = [
        check(scenario, setup.texts[f.index % len(setup.texts)], f, args.tokens,
              sent.get(f"{prefix}{f.index}"))
        for f in fetched
    ]  # fmt: skip
    window = {key: after[key] - before[key] for key in before}
    measured = window["relay_cpu"] + window["upstream_cpu"] + window["client_cpu"]
    window["others_cpu"] = max(0.0, window.pop("busy") - measured)
    result = summarize(scenario, level, checked, window, baseline_rss, peak_rss, warm_failed)
    result["spans_exported"] = spans
    result["spans_expected"] = None if spans is None else spans_of(level)
    return result


def spans_of(level: int) -> int:
    """A traced run's spans: two per request (the proxy's, its upstream attempt's), for the
    first request, the warm-up wave and the measured one."""
    return 2 * (1 + 2 * level)


def wait_exported(port: int, spans: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while sink_counts(port)["spans"] < spans and time.monotonic() < deadline:
        time.sleep(0.05)


def clocks(relay: Child | None, upstream: Child) -> dict[str, float]:
    return {
        "wall": time.perf_counter(),
        "relay_cpu": tree_cpu(relay.pid) if relay is not None else 0.0,
        "relay_sched": tree_schedstat_cpu(relay.pid) if relay is not None else 0.0,
        "upstream_cpu": process_cpu_seconds(upstream.pid),
        "client_cpu": self_cpu_seconds(),
        "busy": machine_busy_seconds(),
    }


def summarize(
    scenario: Scenario,
    level: int,
    checked: list[Checked],
    window: dict[str, float],
    baseline_rss: int,
    peak_rss: int,
    warm_failed: list[str],
) -> dict[str, Any]:
    verified = [c for c in checked if c.problem is None]
    tokens = sum(c.tokens for c in verified)
    delivered = sum(c.delivered for c in checked)
    ttfts = sorted(c.ttft for c in verified if c.ttft is not None)
    delays = sorted(d for c in verified for d in c.delays)
    late = sorted(x for c in checked for x in c.late)
    lag = sorted(x for c in checked for x in c.lag)
    relay_cpu = window["relay_cpu"]
    body = sum(c.body_bytes for c in checked)
    expected = sum(c.tokens for c in checked)
    problems = [c.problem for c in checked if c.problem is not None]
    return {
        "level": level,
        "scenario": scenario.key,
        "relay": scenario.relay,
        "stream_format": scenario.stream_format or "json",
        "coding": scenario.coding,
        "streams": len(checked),
        "verified_streams": len(verified),
        "failed_streams": len(checked) - len(verified),
        "problems": problems[:5],
        "warmup_failures": warm_failed[:5],
        "tokens_expected": expected,
        "tokens_verified": tokens,
        "tokens_delivered": delivered,
        "lost_tokens": sum(c.lost for c in checked),
        "duplicated_tokens": sum(c.duplicated for c in checked),
        "wall_seconds": window["wall"],
        "relay_cpu_seconds": relay_cpu if scenario.relay != "none" else None,
        "relay_cpu_schedstat_seconds": window["relay_sched"] if scenario.relay != "none" else None,
        "relay_cpu_us_per_token": relay_cpu / delivered * 1e6
        if scenario.relay != "none" and delivered
        else None,
        "tokens_per_relay_cpu_second": delivered / relay_cpu if relay_cpu else None,
        "upstream_cpu_seconds": window["upstream_cpu"],
        "client_cpu_seconds": window["client_cpu"],
        "others_cpu_seconds": window["others_cpu"],
        "body_bytes": body,
        "body_bytes_per_token": body / expected if expected else None,
        "client_reads_per_token": sum(c.reads for c in checked) / expected if expected else None,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "ttft_max_ms": ms(ttfts[-1] if ttfts else None),
        "delay_p50_ms": ms(percentile(delays, 50)),
        "delay_p99_ms": ms(percentile(delays, 99)),
        "delay_max_ms": ms(delays[-1] if delays else None),
        "delayed_tokens": len(delays),
        "upstream_late_p50_ms": ms(percentile(late, 50)),
        "upstream_late_p99_ms": ms(percentile(late, 99)),
        "client_lag_p50_ms": ms(percentile(lag, 50)),
        "client_lag_p99_ms": ms(percentile(lag, 99)),
        "relay_rss_baseline_bytes": baseline_rss if scenario.relay != "none" else None,
        "relay_rss_peak_bytes": peak_rss if scenario.relay != "none" else None,
        "relay_rss_per_stream_kib": (peak_rss - baseline_rss) / level / KiB
        if scenario.relay != "none"
        else None,
    }


def _diff(result: dict[str, Any], ref: dict[str, Any] | None, key: str) -> float | None:
    if ref is None or result[key] is None or ref[key] is None:
        return None
    return float(result[key] - ref[key])


def _ratio(result: dict[str, Any], ref: dict[str, Any] | None, key: str) -> float | None:
    if ref is None or result[key] is None or not ref[key]:
        return None
    return float(result[key] / ref[key])


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each scenario against `direct` and `nginx` of the same level, same run."""
    by_level: dict[int, dict[str, dict[str, Any]]] = {}
    for r in results:
        by_level.setdefault(r["level"], {})[r["scenario"]] = r
    for r in results:
        direct, nginx = by_level[r["level"]].get("direct"), by_level[r["level"]].get("nginx")
        r["cpu_per_token_vs_nginx"] = _ratio(r, nginx, "relay_cpu_us_per_token")
        r["bytes_per_token_vs_direct"] = _ratio(r, direct, "body_bytes_per_token")
        r["rss_per_stream_vs_nginx"] = _ratio(r, nginx, "relay_rss_per_stream_kib")
        for key in ("ttft_p50_ms", "ttft_p99_ms", "delay_p50_ms", "delay_p99_ms"):
            name = key.removesuffix("_ms")
            r[f"{name}_added_vs_direct_ms"] = _diff(r, direct, key)
            r[f"{name}_added_vs_nginx_ms"] = _diff(r, nginx, key)


# --- report ---------------------------------------------------------------------------------


COST: list[Column] = [
    ("streams", lambda r: r["level"]),
    ("scenario", lambda r: r["scenario"]),
    ("tokens", lambda r: r["tokens_delivered"]),
    ("lost", lambda r: r["lost_tokens"]),
    ("relay µs/token", lambda r: r["relay_cpu_us_per_token"]),
    ("tokens per relay CPU-s", lambda r: r["tokens_per_relay_cpu_second"]),
    ("CPU x nginx", lambda r: times(r["cpu_per_token_vs_nginx"])),
    ("B/token", lambda r: r["body_bytes_per_token"]),
    ("B x direct", lambda r: times(r["bytes_per_token_vs_direct"])),
    ("RSS KiB/stream", lambda r: r["relay_rss_per_stream_kib"]),
    ("client reads/token", lambda r: r["client_reads_per_token"]),
]
LATENCY: list[Column] = [
    ("streams", lambda r: r["level"]),
    ("scenario", lambda r: r["scenario"]),
    ("TTFT p50", lambda r: r["ttft_p50_ms"]),
    ("TTFT p99", lambda r: r["ttft_p99_ms"]),
    ("+direct p50", lambda r: plus(r["ttft_p50_added_vs_direct_ms"])),
    ("+direct p99", lambda r: plus(r["ttft_p99_added_vs_direct_ms"])),
    ("delay p50", lambda r: r["delay_p50_ms"]),
    ("delay p99", lambda r: r["delay_p99_ms"]),
    ("delay max", lambda r: r["delay_max_ms"]),
    ("+direct p99", lambda r: plus(r["delay_p99_added_vs_direct_ms"])),
    ("+nginx p99", lambda r: plus(r["delay_p99_added_vs_nginx_ms"])),
    ("upstream late p99", lambda r: r["upstream_late_p99_ms"]),
    ("client lag p99", lambda r: r["client_lag_p99_ms"]),
]
CLOCKS: list[Column] = [
    ("streams", lambda r: r["level"]),
    ("scenario", lambda r: r["scenario"]),
    ("wall s", lambda r: r["wall_seconds"]),
    ("relay CPU s", lambda r: r["relay_cpu_seconds"]),
    ("relay CPU s (schedstat)", lambda r: r["relay_cpu_schedstat_seconds"]),
    ("upstream CPU s", lambda r: r["upstream_cpu_seconds"]),
    ("client CPU s", lambda r: r["client_cpu_seconds"]),
    ("others CPU s", lambda r: r["others_cpu_seconds"]),
]


def report_table(columns: list[Column], results: list[dict[str, Any]]) -> str:
    return table([name for name, _ in columns], [[get(r) for _, get in columns] for r in results])


def print_report(results: list[dict[str, Any]]) -> None:
    print(
        "\nCost per token (relay: the process tree between client and upstream; x nginx, "
        "x direct: against theirs at the same level in this run)\n" + report_table(COST, results)
    )
    print(
        "\nLatency, ms (TTFT: connect to first decodable token; delay: upstream write to "
        "decodable at the client; +direct, +nginx: minus theirs, same level, same run)\n"
        + report_table(LATENCY, results)
    )
    print("\nCPU seconds in the measured wave\n" + report_table(CLOCKS, results))


# --- main -----------------------------------------------------------------------------------


def raise_fd_limit(level: int) -> None:
    """Every stream is a socket here, and two in a relay (children inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 8 * level + 1024))
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    print(f"machine: {info['nproc']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    gguf = assets.SMOLLM2_GGUF.ensure()
    vocabulary = Vocabulary.build(load_tokenizer(gguf))
    texts = make_texts(vocabulary, args.tokens, min(TEXTS, max(args.levels)))
    path = texts_file(texts, args.tokens)
    print(
        f"texts: {len(texts)} x {args.tokens} tokens of {CORPUS.relative_to(ROOT)} "
        f"({sum(len(t.deltas) for t in texts) / len(texts):.1f} events each)"
    )
    nginx = nginx_binary()
    scenarios = [SCENARIOS[key] for key in args.scenarios]
    skipped: list[str] = []
    if nginx is None and any(s.relay == "nginx" for s in scenarios):
        print(
            "nginx is not installed: the nginx scenario is skipped "
            "(apt-get install nginx-light to include it)"
        )
        scenarios = [s for s in scenarios if s.relay != "nginx"]
        skipped.append("nginx: not installed")
    raise_fd_limit(max(args.levels))

    upstream_port = free_port()
    upstream_args = [
        "-m", "bench.paced_upstream",
        "--streams-file", str(path),
        "--port", str(upstream_port),
        "--pace-ms", str(args.pace_ms),
        "--schedule", args.schedule,
    ]  # fmt: skip
    if args.no_logprobs:
        upstream_args.append("--no-logprobs")
    upstream = spawn("paced upstream", upstream_args, bench_cache_dir() / "paced-upstream.log")
    wait_http_ok(upstream, f"http://127.0.0.1:{upstream_port}/health")
    setup = Setup(args, texts, gguf, upstream, upstream_port, nginx, f"run{os.getpid()}")

    started = time.monotonic()
    results = []
    try:
        for level in args.levels:
            print(f"\n{level} streams x {args.tokens} tokens, {args.pace_ms:g} ms", flush=True)
            for scenario in scenarios:
                result = await run_scenario(setup, scenario, level)
                results.append(result)
                print(
                    f"  {scenario.key:<12} {result['verified_streams']}/{result['streams']} ok, "
                    f"{result['tokens_delivered']:,} tokens, lost {result['lost_tokens']}, "
                    + (
                        f"relay {result['relay_cpu_us_per_token']:.1f} µs/token, "
                        if result["relay_cpu_us_per_token"] is not None
                        else ""
                    )
                    + f"TTFT p50 {_fmt(result['ttft_p50_ms'])} ms, "
                    f"delay p99 {_fmt(result['delay_p99_ms'])} ms "
                    f"({result['wall_seconds']:.1f} s, others {result['others_cpu_seconds']:.1f}"
                    " CPU s)",
                    flush=True,
                )
                for problem in result["problems"][:2]:
                    print(f"    problem: {problem}")
    finally:
        upstream.stop()
    duration = time.monotonic() - started
    add_ratios(results)
    print_report(results)
    failed = (
        [
            f"{r['level']} streams, {r['scenario']}: {r['failed_streams']} failed streams, "
            f"{r['lost_tokens']} lost / {r['duplicated_tokens']} extra tokens {r['problems'][:2]}"
            for r in results
            if r["failed_streams"] or r["lost_tokens"] or r["duplicated_tokens"]
        ]
        + [
            f"{r['level']} streams, {r['scenario']}: warm-up failed: {r['warmup_failures']}"
            for r in results
            if r["warmup_failures"]
        ]
        + [
            f"{r['level']} streams, {r['scenario']}: {r['spans_exported']} spans exported of "
            f"{r['spans_expected']}"
            for r in results
            if r["spans_exported"] is not None and r["spans_exported"] < r["spans_expected"]
        ]
    )
    verdict = "CHECKS FAILED:\n  " + "\n  ".join(failed) if failed else "every response verified"
    print("\n" + verdict)
    info["loadavg_at_end"] = loadavg()
    info["commit_at_end"] = git_commit()
    print(f"duration {duration:.0f} s, load average at end {info['loadavg_at_end']}")
    return {
        "benchmark": "paced",
        "mode": "quick" if args.quick else "full",
        "command": "python bench/paced.py " + " ".join(sys.argv[1:]),
        "duration_seconds": duration,
        "machine": info,
        "settings": {
            "levels": args.levels,
            "tokens": args.tokens,
            "pace_ms": args.pace_ms,
            "schedule": args.schedule,
            "ramp_ms": args.ramp_ms,
            "scenarios": [s.key for s in scenarios],
            "skipped": skipped,
            "upstream_logprobs": not args.no_logprobs,
            "texts": len(texts),
            "corpus": str(CORPUS.relative_to(ROOT)),
            "proxy": "python -m proxy serve --token-ids auto|retokenize --drift-check off "
            "--health-interval 3600 (one worker, other settings default)",
            "nginx": "worker_processes 1; proxy_buffering off; proxy_http_version 1.1; "
            "upstream keepalive max(streams, 16)",
        },
        "results": results,
        "failed": failed,
    }


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--streams", type=int, help="concurrent streams (default 32; quick 8)")
    parser.add_argument(
        "--levels",
        type=lambda s: [int(x) for x in s.split(",")],
        help="several concurrency levels in one run, e.g. 1,32,200,1000 (overrides --streams)",
    )
    parser.add_argument("--tokens", type=int, help="tokens per stream (default 256; quick 48)")
    parser.add_argument("--pace-ms", type=float, default=20.0, help="between events (20)")
    parser.add_argument(
        "--ramp-ms", type=float, help="streams start evenly over this long (1000; quick 200)"
    )
    parser.add_argument(
        "--schedule",
        choices=("batched", "spread"),
        default="batched",
        help="events on one step clock for all streams (batched), or per stream (spread)",
    )
    parser.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        default=list(SCENARIOS),
        help=f"comma-separated, of {','.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--no-logprobs",
        action="store_true",
        help="the upstream answers the proxy's `logprobs: 1` with null (vLLM sends them)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the proxy with py-spy during each wave (collapsed stacks in DIR)",
    )
    parser.add_argument("--json", type=Path, help="results file (default bench/results/paced.json)")
    args = parser.parse_args(argv)
    args.scenarios = list(dict.fromkeys(args.scenarios))  # each once, in the order given
    unknown = [key for key in args.scenarios if key not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {','.join(SCENARIOS)}")
    quick = args.quick
    for name, full, short in (("streams", 32, 8), ("tokens", 256, 48), ("ramp_ms", 1000.0, 200.0)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if args.levels is None:
        args.levels = [args.streams]
    with cleanup_on_exit():
        payload = asyncio.run(run(args))
    write_results(args.json or results_path("paced", quick=quick), payload)
    return 1 if payload["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
