"""Proxy CPU cost: tokens per second per proxy core, JSON pass-through overhead, pipeline breakdown.

    .venv/bin/python bench/throughput.py            # full run (a few minutes)
    .venv/bin/python bench/throughput.py --quick    # smoke run (seconds, no llama.cpp needed)

Three processes on one machine, side by side in one run:

- a fast local upstream (`bench/replay_upstream.py`) replaying one recorded llama.cpp stream as
  fast as it can, one write per SSE event;
- the proxy, `python -m proxy serve`, as deployed; its CPU time (utime + stime of the whole
  process, all threads) is read from /proc/<pid>/stat before and after each scenario;
- the load client, here: aiohttp, C concurrent streams, a fixed number of requests.

Scenarios, interleaved in every round: (a) client -> upstream directly (JSON-SSE), (b) client ->
proxy pass-through (JSON), (c) Codec msgpack, (d) Codec protobuf. Every response is checked:
JSON bodies must equal the upstream's bytes; each Codec body must decode to exactly the IDs the
tokenizer gives the stream's text, and end with one `done` frame. The Codec bodies are kept and
decoded after the timed window, so checking costs the client nothing while it is timed.

Streams: `recorded` is a real 512-token llama.cpp answer (SmolLM2-135M, recorded once, cached in
`.cache/bench/`); `synthetic` repeats the events of tests/fixtures/upstream/
llamacpp-completions-sample.txt to 512 tokens (no llama.cpp needed).

Then, in this process and without HTTP, the per-token CPU cost of the sans-IO pipeline alone,
stage by stage (bench/pipeline.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from bench._common import (
    Child,
    bench_cache_dir,
    cleanup_on_exit,
    git_commit,
    loadavg,
    machine_busy_seconds,
    machine_info,
    process_cpu_seconds,
    register_cleanup,
    results_path,
    self_cpu_seconds,
    spawn,
    table,
    wait_http_ok,
    write_results,
)
from bench.pipeline import run_pipeline
from bench.replay_upstream import split_events
from proxy import assets
from proxy.core.wire.decoder import FrameDecodeError, FrameDecoder
from proxy.embedded import EmbeddedBackend, free_port
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

STREAM_TOKENS = 512
RECORD_PROMPT = "Write a detailed guide to growing tomatoes at home.\n\n"
RECORDING = f"llamacpp-completions-{STREAM_TOKENS}.sse"
FIXTURE = (
    Path(__file__).resolve().parent.parent
    / "tests/fixtures/upstream/llamacpp-completions-sample.txt"
)
# Codec's target and the pass-through budget, reported next to the figures, never asserted.
TARGET_CODEC_TOKENS_PER_CORE = 30_000
TARGET_PASSTHROUGH_OVERHEAD = 0.10


# --- the upstream streams -------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    name: str
    body: bytes
    completion_tokens: int  # the upstream's own count (usage), i.e. events with a token
    expected_ids: tuple[int, ...]  # what the Codec stream must carry: encode(text)
    source: str

    @property
    def text(self) -> str:
        return stream_text(self.body)


def stream_text(body: bytes) -> str:
    parts = []
    for event in split_events(body):
        data = event.strip().removeprefix(b"data: ")
        if data and data != b"[DONE]":
            parts.append(json.loads(data)["choices"][0]["text"])
    return "".join(parts)


def usage_tokens(body: bytes) -> int:
    match = re.findall(rb'"completion_tokens":(\d+)', body)
    if not match:
        raise ValueError("stream has no usage.completion_tokens")
    return int(match[-1])


def record_stream(gguf: Path, target: Path) -> None:
    """One real llama.cpp answer, ~512 tokens, as the raw SSE body bytes it sent."""
    import urllib.request

    request = {
        "prompt": RECORD_PROMPT,
        "max_tokens": STREAM_TOKENS,
        "temperature": 0,
        "seed": 7,
        "cache_prompt": False,
        "ignore_eos": True,
        "stream": True,
    }
    log = bench_cache_dir() / "record-llama-server.log"
    print(f"recording a {STREAM_TOKENS}-token stream from llama.cpp (once; log {log})")
    backend = EmbeddedBackend(gguf, parallel=1, log_path=log)
    register_cleanup(backend.stop)
    with backend:
        req = urllib.request.Request(
            f"{backend.url}/v1/completions",
            data=json.dumps(request).encode(),
            headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            headers = dict(resp.headers)
            body = resp.read()
    if usage_tokens(body) != STREAM_TOKENS:
        raise RuntimeError(f"recording has {usage_tokens(body)} tokens, not {STREAM_TOKENS}")
    target.with_suffix(".json").write_text(
        json.dumps(
            {
                "request": request,
                "response_headers": headers,
                "model": {"file": gguf.name, "sha256": assets.SMOLLM2_GGUF.sha256},
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
    )
    target.write_bytes(body)


def recorded_stream(gguf: Path, vocabulary: Vocabulary, *, allow_record: bool) -> Stream | None:
    path = bench_cache_dir() / RECORDING
    if not path.exists():
        if not allow_record:
            return None
        record_stream(gguf, path)
    return make_stream("recorded", path.read_bytes(), vocabulary, str(path))


def synthetic_stream(vocabulary: Vocabulary, tokens: int = STREAM_TOKENS) -> Stream:
    """The fixture's token events, cycled to `tokens` events, then its final event and [DONE]."""
    events = split_events(FIXTURE.read_bytes())
    token_events = [e for e in events if b'"finish_reason":null' in e]
    final = next(e for e in events if b'"finish_reason":"length"' in e)
    prompt = int(re.findall(rb'"prompt_tokens":(\d+)', final)[0])
    final = re.sub(rb'"completion_tokens":\d+', b'"completion_tokens":%d' % tokens, final)
    final = re.sub(rb'"total_tokens":\d+', b'"total_tokens":%d' % (prompt + tokens), final)
    body = b"".join(itertools.islice(itertools.cycle(token_events), tokens))
    body += final + b"data: [DONE]\n\n"
    return make_stream("synthetic", body, vocabulary, f"{FIXTURE.name} x {tokens} events")


def make_stream(name: str, body: bytes, vocabulary: Vocabulary, source: str) -> Stream:
    ids = vocabulary.scheme.encode(stream_text(body), at_start=True)
    return Stream(name, body, usage_tokens(body), tuple(ids), source)


# --- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str
    target: Literal["upstream", "proxy"]
    stream_format: Literal["msgpack", "protobuf"] | None  # None: JSON-SSE

    def payload(self, stream: Stream) -> bytes:
        body: dict[str, object] = {"prompt": RECORD_PROMPT, "max_tokens": stream.completion_tokens}
        if self.stream_format is None:
            body["stream"] = True
        else:
            body["stream_format"] = self.stream_format
        return json.dumps(body).encode()


SCENARIOS = (
    Scenario("a", "direct JSON", "upstream", None),
    Scenario("b", "proxy JSON pass-through", "proxy", None),
    Scenario("c", "proxy Codec msgpack", "proxy", "msgpack"),
    Scenario("d", "proxy Codec protobuf", "proxy", "protobuf"),
)


@dataclass(frozen=True)
class Mode:
    """How the upstream replays: flat out, or one event every `interval_ms` per stream."""

    name: str
    interval_ms: float
    concurrencies: list[int]
    requests: int


@dataclass
class Processes:
    upstream: Child
    proxy: Child
    upstream_url: str
    proxy_url: str
    proxy_commit: str | None  # the code the proxy process started from


def start_processes(stream: Stream, gguf: Path, mode: Mode) -> Processes:
    cache = bench_cache_dir()
    body_file = cache / f"replay-{stream.name}.sse"
    body_file.write_bytes(stream.body)
    up_port, proxy_port = free_port(), free_port()
    commit = git_commit()
    upstream = spawn(
        "replay upstream",
        ["-m", "bench.replay_upstream", str(body_file), str(up_port), str(mode.interval_ms)],
        cache / "replay-upstream.log",
    )
    upstream_url = f"http://127.0.0.1:{up_port}"
    try:
        wait_http_ok(upstream, f"{upstream_url}/health")
        proxy = spawn(
            "proxy",
            [
                "-m",
                "proxy",
                "serve",
                "--upstream",
                upstream_url,
                "--tokenizer",
                str(gguf),
                "--port",
                str(proxy_port),
                "--log-level",
                "WARNING",
            ],
            cache / "throughput-proxy.log",
        )
    except BaseException:
        upstream.stop()
        raise
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        wait_http_ok(proxy, f"{proxy_url}/codec/schema", timeout=120)
    except BaseException:
        proxy.stop()
        upstream.stop()
        raise
    return Processes(upstream, proxy, upstream_url, proxy_url, commit)


async def run_scenario(
    scenario: Scenario,
    stream: Stream,
    procs: Processes,
    *,
    concurrency: int,
    requests: int,
) -> dict[str, Any]:
    base = procs.upstream_url if scenario.target == "upstream" else procs.proxy_url
    url = f"{base}/v1/completions"
    payload = scenario.payload(stream)
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    bodies: list[bytes] = []
    statuses: list[int] = []
    latencies: list[float] = []

    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=timeout
    ) as session:

        async def one() -> None:
            started = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as resp:
                body = await resp.read()
                statuses.append(resp.status)
            latencies.append(time.perf_counter() - started)
            bodies.append(body)

        # Warm-up: open the client connections (and the proxy's upstream pool) untimed.
        await asyncio.gather(*(one() for _ in range(concurrency)))
        bodies.clear()
        statuses.clear()
        latencies.clear()
        tickets = iter(range(requests))

        async def worker() -> None:
            for _ in tickets:
                await one()

        proxy_cpu0 = process_cpu_seconds(procs.proxy.pid)
        upstream_cpu0 = process_cpu_seconds(procs.upstream.pid)
        client_cpu0 = self_cpu_seconds()
        busy0 = machine_busy_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        proxy_cpu = process_cpu_seconds(procs.proxy.pid) - proxy_cpu0
        upstream_cpu = process_cpu_seconds(procs.upstream.pid) - upstream_cpu0
        client_cpu = self_cpu_seconds() - client_cpu0
        busy = machine_busy_seconds() - busy0

    verdict = verify(scenario, stream, bodies, statuses)
    tokens = verdict.pop("tokens")
    latencies.sort()
    return {
        "scenario": scenario.key,
        "concurrency": concurrency,
        "requests": len(bodies),
        "wall_seconds": wall,
        "tokens": tokens,
        "tokens_per_second": tokens / wall,
        "proxy_cpu_seconds": proxy_cpu,
        "tokens_per_proxy_cpu_second": tokens / proxy_cpu if proxy_cpu > 0 else None,
        "upstream_cpu_seconds": upstream_cpu,
        "client_cpu_seconds": client_cpu,
        # Everything else that ran on the machine meanwhile (other jobs share it).
        "other_cpu_seconds": max(0.0, busy - proxy_cpu - upstream_cpu - client_cpu),
        "latency_p50_ms": latencies[len(latencies) // 2] * 1000,
        "latency_max_ms": latencies[-1] * 1000,
        "wire_bytes_per_request": sum(map(len, bodies)) / len(bodies),
        **verdict,
    }


def verify(
    scenario: Scenario, stream: Stream, bodies: list[bytes], statuses: list[int]
) -> dict[str, Any]:
    """Check every response; count tokens only from verified output."""
    bad_status = sum(status != 200 for status in statuses)
    if scenario.stream_format is None:
        wrong = sum(body != stream.body for body in bodies)
        return {
            "tokens": stream.completion_tokens * (len(bodies) - wrong),
            "bad_status": bad_status,
            "wrong_bodies": wrong,
            "frames_per_stream": None,
        }
    wrong = 0
    frames_total = 0
    failures: list[str] = []
    for body in bodies:
        decoder = FrameDecoder(scenario.stream_format)
        try:
            frames = decoder.feed(body)
            decoder.flush()
        except FrameDecodeError as exc:
            wrong += 1
            failures.append(f"undecodable: {exc}")
            continue
        ids = tuple(token_id for frame in frames for token_id in frame.ids)
        done = [frame for frame in frames if frame.done]
        ok = ids == stream.expected_ids and len(done) == 1 and frames[-1].done
        if ok and frames[-1].finish_reason != "length":
            ok = False
        if not ok:
            wrong += 1
            reason = frames[-1].finish_reason if frames else None
            failures.append(
                f"{len(ids)} ids (expected {len(stream.expected_ids)}), "
                f"{len(done)} done frames, finish_reason {reason}"
            )
        frames_total += len(frames)
    return {
        "tokens": len(stream.expected_ids) * (len(bodies) - wrong),
        "bad_status": bad_status,
        "wrong_bodies": wrong,
        "frames_per_stream": frames_total / len(bodies) if bodies else None,
        "failures": failures[:5],
    }


async def run_http(stream: Stream, gguf: Path, mode: Mode, *, rounds: int) -> list[dict[str, Any]]:
    procs = start_processes(stream, gguf, mode)
    runs: list[dict[str, Any]] = []
    try:
        for round_index in range(rounds):
            for concurrency in mode.concurrencies:
                for scenario in SCENARIOS:
                    result = await run_scenario(
                        scenario, stream, procs, concurrency=concurrency, requests=mode.requests
                    )
                    result |= {
                        "stream": stream.name,
                        "mode": mode.name,
                        "round": round_index,
                        "proxy_commit": procs.proxy_commit,
                    }
                    runs.append(result)
                    per_core = result["tokens_per_proxy_cpu_second"]
                    flag = (
                        ""
                        if not (result["wrong_bodies"] or result["bad_status"])
                        else f"  WRONG {result['wrong_bodies']} / status {result['bad_status']}"
                    )
                    print(
                        f"  {stream.name:<9} {mode.name:<8} r{round_index} C={concurrency:<3} "
                        f"({scenario.key}) {scenario.name:<24} "
                        f"{result['wall_seconds']:6.2f}s {result['tokens_per_second']:>9,.0f} tok/s"
                        f"  proxy cpu {result['proxy_cpu_seconds']:5.2f}s"
                        + (f" -> {per_core:,.0f} tok/s/core" if per_core else "")
                        + f"  (others {result['other_cpu_seconds']:.2f}s)"
                        + flag
                    )
    finally:
        procs.proxy.stop()
        procs.upstream.stop()
    return runs


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds per (stream, concurrency, scenario); overhead paired by round."""
    rows = []
    keys = list(dict.fromkeys((r["stream"], r["mode"], r["concurrency"]) for r in runs))
    for stream, mode, concurrency in keys:
        subset = [
            r
            for r in runs
            if (r["stream"], r["mode"], r["concurrency"]) == (stream, mode, concurrency)
        ]
        direct_wall = {r["round"]: r["wall_seconds"] for r in subset if r["scenario"] == "a"}
        for scenario in SCENARIOS:
            mine = [r for r in subset if r["scenario"] == scenario.key]
            if not mine:
                continue
            per_core = [r["tokens_per_proxy_cpu_second"] for r in mine]
            overheads = [
                r["wall_seconds"] / direct_wall[r["round"]] - 1
                for r in mine
                if r["round"] in direct_wall
            ]
            rows.append(
                {
                    "stream": stream,
                    "mode": mode,
                    "concurrency": concurrency,
                    "scenario": scenario.key,
                    "name": scenario.name,
                    "rounds": len(mine),
                    "requests": mine[0]["requests"],
                    "wall_seconds": statistics.median(r["wall_seconds"] for r in mine),
                    "tokens": mine[0]["tokens"],
                    "tokens_per_second": statistics.median(r["tokens_per_second"] for r in mine),
                    "proxy_cpu_seconds": statistics.median(r["proxy_cpu_seconds"] for r in mine),
                    "tokens_per_proxy_cpu_second": (
                        statistics.median(per_core) if None not in per_core else None
                    ),
                    "tokens_per_proxy_cpu_second_range": (
                        [min(per_core), max(per_core)] if None not in per_core else None
                    ),
                    "wall_overhead_vs_direct": (
                        statistics.median(overheads) if scenario.key != "a" else None
                    ),
                    "upstream_cpu_seconds": statistics.median(
                        r["upstream_cpu_seconds"] for r in mine
                    ),
                    "client_cpu_seconds": statistics.median(r["client_cpu_seconds"] for r in mine),
                    "other_cpu_seconds": statistics.median(r["other_cpu_seconds"] for r in mine),
                    "latency_p50_ms": statistics.median(r["latency_p50_ms"] for r in mine),
                    "frames_per_stream": mine[0]["frames_per_stream"],
                    "wire_bytes_per_request": mine[0]["wire_bytes_per_request"],
                    "all_verified": all(
                        r["wrong_bodies"] == 0 and r["bad_status"] == 0 for r in mine
                    ),
                }
            )
    return rows


def print_http(rows: list[dict[str, Any]]) -> None:
    headers = [
        "stream",
        "upstream",
        "C",
        "scenario",
        "wall s",
        "tokens",
        "tok/s",
        "proxy CPU s",
        "tok/s per proxy core",
        "wall vs (a)",
        "upstream CPU s",
        "client CPU s",
        "others CPU s",
        "frames/stream",
        "verified",
    ]
    body = [
        [
            r["stream"],
            r["mode"],
            r["concurrency"],
            f"({r['scenario']}) {r['name']}",
            r["wall_seconds"],
            r["tokens"],
            r["tokens_per_second"],
            r["proxy_cpu_seconds"],
            r["tokens_per_proxy_cpu_second"],
            (
                f"{r['wall_overhead_vs_direct'] * 100:+.0f}%"
                if r["wall_overhead_vs_direct"] is not None
                else "–"
            ),
            r["upstream_cpu_seconds"],
            r["client_cpu_seconds"],
            r["other_cpu_seconds"],
            r["frames_per_stream"],
            r["all_verified"],
        ]
        for r in rows
    ]
    print("\nHTTP, median over rounds\n" + table(headers, body))


def print_pipeline(name: str, result: dict[str, Any]) -> None:
    stage_rows = []
    for chunking, data in result.items():
        us = data["us_per_token"]
        total = us["total.msgpack"]
        for stage in (
            "sse",
            "parse",
            "parse.json_loads",
            "retokenize",
            "retokenize.hf_encode",
            "retokenize.hf_encode+read_fields",
            "glue",
            "encode.msgpack",
            "encode.protobuf",
            "total.msgpack",
            "total.protobuf",
        ):
            share = f"{us[stage] / total * 100:.0f}%" if not stage.startswith("total") else ""
            stage_rows.append([chunking, stage, us[stage], share])
    print(
        f"\nSans-IO pipeline, {name} stream: CPU µs per token (share of total.msgpack)\n"
        + table(["chunking", "stage", "µs/token", "share"], stage_rows)
    )
    summary = [
        [
            chunking,
            data["tokens"],
            data["frames"],
            data["ids_per_frame"],
            data["hf_encode_calls"],
            data["mean_window_chars"],
            data["tokens_per_cpu_second"]["msgpack"],
            data["tokens_per_cpu_second"]["protobuf"],
            all(v is True or v == "length" for v in data["checks"].values()),
        ]
        for chunking, data in result.items()
    ]
    headers = [
        "chunking",
        "tokens",
        "frames",
        "ids/frame",
        "encode calls",
        "window chars",
        "tok/CPU-s msgpack",
        "tok/CPU-s protobuf",
        "verified",
    ]
    print(table(headers, summary))


# --- main -----------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    print(f"machine: {info['nproc']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    gguf = assets.SMOLLM2_GGUF.ensure()
    vocabulary = Vocabulary.build(load_tokenizer(gguf))
    streams: list[Stream] = []
    if "recorded" in args.streams:
        recorded = recorded_stream(gguf, vocabulary, allow_record=not args.quick)
        if recorded is None:
            print("no cached recording: --quick does not start llama.cpp; using synthetic only")
        else:
            streams.append(recorded)
    if "synthetic" in args.streams:
        streams.append(synthetic_stream(vocabulary))
    for stream in streams:
        digest = hashlib.sha256(stream.body).hexdigest()[:16]
        print(
            f"stream {stream.name}: {len(stream.body):,} bytes, {stream.completion_tokens} "
            f"upstream tokens, {len(stream.expected_ids)} IDs after retokenizing, "
            f"sha256 {digest}"
        )

    modes = [
        Mode("flat-out", 0.0, args.concurrency, args.requests),
        Mode("paced", args.paced_interval_ms, [args.paced_concurrency], args.paced_requests),
    ]
    modes = [mode for mode in modes if mode.name in args.modes]
    http_runs: list[dict[str, Any]] = []
    if not args.skip_http:
        for mode in modes:
            print(
                f"\nHTTP, upstream {mode.name} (interval {mode.interval_ms} ms): "
                f"{mode.requests} requests per scenario, concurrency {mode.concurrencies}, "
                f"{args.rounds} round(s)"
            )
            for stream in streams:
                http_runs += await run_http(stream, gguf, mode, rounds=args.rounds)
    http_rows = aggregate(http_runs)
    if http_rows:
        print_http(http_rows)

    pipeline: dict[str, Any] = {}
    if not args.skip_pipeline:
        for stream in streams:
            pipeline[stream.name] = run_pipeline(
                vocabulary.scheme, stream.body, list(stream.expected_ids), quick=args.quick
            )
            print_pipeline(stream.name, pipeline[stream.name])

    failed = [
        f"{r['stream']} C={r['concurrency']} ({r['scenario']})"
        for r in http_rows
        if not r["all_verified"]
    ]
    failed += [
        f"pipeline {name} {chunking}"
        for name, result in pipeline.items()
        for chunking, data in result.items()
        if not all(v is True or v == "length" for v in data["checks"].values())
    ]
    print("\nall outputs verified" if not failed else f"\nVERIFICATION FAILED: {failed}")
    commits = sorted({str(r["proxy_commit"]) for r in http_runs} | {str(info["git_commit"])})
    if len(commits) > 1:
        print(f"WARNING: the code changed during the run; commits measured: {commits}")
    info["commits_measured"] = commits
    info["loadavg_at_end"] = loadavg()
    return {
        "benchmark": "throughput",
        "mode": "quick" if args.quick else "full",
        "command": "python bench/throughput.py" + (" --quick" if args.quick else ""),
        "machine": info,
        "settings": {
            "modes": [dataclasses.asdict(mode) for mode in modes],
            "rounds": args.rounds,
            "upstream_writes": "one write per SSE event; flat out, or interval_ms before each "
            "token event but the first",
            "proxy": "python -m proxy serve (default settings, asyncio event loop)",
        },
        "targets": {
            "codec_tokens_per_proxy_core_second": TARGET_CODEC_TOKENS_PER_CORE,
            "passthrough_wall_overhead": TARGET_PASSTHROUGH_OVERHEAD,
        },
        "streams": [
            {
                "name": s.name,
                "source": s.source,
                "body_bytes": len(s.body),
                "completion_tokens": s.completion_tokens,
                "codec_ids": len(s.expected_ids),
                "sha256": hashlib.sha256(s.body).hexdigest(),
            }
            for s in streams
        ],
        "http": http_rows,
        "http_runs": http_runs,
        "pipeline": pipeline,
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (seconds)")
    parser.add_argument("--requests", type=int, help="requests per scenario (default 200; 16)")
    parser.add_argument("--rounds", type=int, help="rounds of all scenarios (default 3; 1)")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 16],
        help="comma-separated concurrent streams (default 1,16)",
    )
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["flat-out", "paced"],
        help="upstream modes: flat-out,paced (default both)",
    )
    parser.add_argument("--paced-interval-ms", type=float, default=5.0)
    parser.add_argument("--paced-concurrency", type=int, default=16)
    parser.add_argument("--paced-requests", type=int, help="default 48; 16 with --quick")
    parser.add_argument(
        "--streams",
        type=lambda s: s.split(","),
        default=["recorded", "synthetic"],
        help="recorded,synthetic (default both)",
    )
    parser.add_argument("--skip-http", action="store_true", help="only the in-process pipeline")
    parser.add_argument("--skip-pipeline", action="store_true", help="only the HTTP scenarios")
    parser.add_argument("--output", type=Path, help="results file (default bench/results/)")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 16 if args.quick else 200
    if args.paced_requests is None:
        args.paced_requests = 16 if args.quick else 48
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    with cleanup_on_exit():
        payload = asyncio.run(run(args))
    write_results(args.output or results_path("throughput", quick=args.quick), payload)
    return 1 if payload["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
