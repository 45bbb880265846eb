"""What a request costs before its first token: short streams, relay CPU per request.

    .venv/bin/python bench/short.py                    # every workload, every relay, one run
    .venv/bin/python bench/short.py --runs 3           # three runs; medians and ranges
    .venv/bin/python bench/short.py --quick            # smoke run (about a minute)
    .venv/bin/python bench/short.py --steps DIR --clients 1 --scenarios passthrough,backend-ids
                                                       # the steps of a request, timed in place

Agents, tool calls, classifiers and routers send many short requests. For them a relay's cost
is per request, not per token. The processes are bench/paced.py's (the paced upstream in its own
process, one relay, this process as the client, every read stamped by the kernel), and so are
the checks: every JSON body must equal the upstream's bytes, every Codec stream must decode to
the IDs the upstream sent, with one terminal frame. Workloads (`--workloads`):

- `burst`: `--burst` streams (500) of `--burst-tokens` (2) tokens, started evenly over
  `--ramp-ms` (1 s), each on a new client connection;
- `clients-new`: `--clients` (32) clients, each sending `--requests` (16) requests of
  `--tokens` (16) tokens back to back, a new connection per request;
- `clients-kept`: the same on one kept-alive connection per client (as the OpenAI SDK keeps
  them).

Relays (`--scenarios`): `direct` (no relay: the reference for time to first token), `nginx`
(bench/paced.py's config), `bare` (bench/bare_relay.py: one aiohttp handler on the proxy's own
upstream connections, nothing else: the floor under the proxy), `passthrough` (JSON through
the proxy), `backend-ids` (Codec msgpack from the upstream's IDs); bench/paced.py's other proxy
scenarios are accepted too. Each relay starts fresh per run, takes one request and a warm-up
wave of `--clients` two-token streams (which fills its upstream pool), then each workload.

Measured per relay and workload: the relay process tree's CPU (schedstat, nanoseconds; the
/proc/<pid>/stat ticks beside it) over the requests answered: µs per request, requests per
relay CPU-second, against nginx's and the bare relay's in the same run; time to first token
(from just before the connect, or the send on a kept-alive connection, to the kernel time of
the read that completes the first token) and its p50/p99 minus `direct`'s; the CPU seconds
other processes used meanwhile (the machine may be shared). With `--runs N` the report is the
median over the runs, with the range. `--profile DIR` samples the proxy with py-spy during
each workload (1 kHz, collapsed stacks; a separate run, since sampling costs the proxy a
little); `--steps DIR` times each step of a request in place (bench/request_steps.py), for
requests sent one at a time (`--clients 1`).
Results: bench/results/short.json (`--json`). Timings are reported, never asserted; the exit
status is 1 when a response fails its check.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Child,
    Column,
    bench_cache_dir,
    cleanup_on_exit,
    git_commit,
    loadavg,
    machine_info,
    plus,
    results_path,
    spawn,
    table,
    times,
    wait_http_ok,
    write_results,
)
from bench.paced import (
    SCENARIOS,
    Fetched,
    Scenario,
    check,
    client_socket,
    clocks,
    fetch,
    fetch_on,
    fetch_sent,
    make_texts,
    ms,
    nginx_binary,
    percentile,
    raise_fd_limit,
    request_bytes,
    start_nginx,
    start_proxy,
    start_py_spy,
    texts_file,
    wave,
)
from bench.paced_upstream import Text
from proxy import assets
from proxy.embedded import free_port
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

RELAYS = {
    **{key: SCENARIOS[key] for key in ("direct", "nginx")},
    "bare": Scenario("bare", "bare", None),
    **SCENARIOS,
}
DEFAULT_SCENARIOS = ("direct", "nginx", "bare", "passthrough", "backend-ids")
WORKLOADS = ("burst", "clients-new", "clients-kept")
TEXTS = 64


@dataclass(frozen=True)
class Workload:
    key: str
    connection: str  # "new" or "kept": what each request's client connection is
    tokens: int
    requests: int


def workloads(args: argparse.Namespace) -> list[Workload]:
    table = {
        "burst": Workload("burst", "new", args.burst_tokens, args.burst),
        "clients-new": Workload("clients-new", "new", args.tokens, args.clients * args.requests),
        "clients-kept": Workload("clients-kept", "kept", args.tokens, args.clients * args.requests),
    }
    return [table[key] for key in args.workloads]


def cut(text: Text, tokens: int) -> Text:
    """The events the upstream sends for `max_tokens=tokens` (it ends at the event that
    reaches `tokens`): what a short stream of `text` carries."""
    total = 0
    for end, ids in enumerate(text.ids, 1):
        total += len(ids)
        if total >= tokens:
            return Text(text.deltas[:end], text.ids[:end])
    return text


def start_bare(upstream_port: int) -> tuple[Child, int]:
    port = free_port()
    args = ["-m", "bench.bare_relay", "--port", str(port), "--upstream-port", str(upstream_port)]
    child = spawn("bare relay", args, bench_cache_dir() / "short-bare.log")
    wait_http_ok(child, f"http://127.0.0.1:{port}/health", timeout=60)
    return child, port


# --- the clients ------------------------------------------------------------------------------


async def back_to_back(
    port: int, requests: Sequence[Sequence[tuple[int, bytes]]], kept: bool, time_limit: float
) -> list[Fetched]:
    """Each client sends its requests one after the other, on a new connection each or on one
    kept-alive connection; the clients start evenly over 10 ms."""
    loop = asyncio.get_running_loop()

    async def client(number: int, mine: Sequence[tuple[int, bytes]]) -> list[Fetched]:
        await asyncio.sleep(number * 0.01 / len(requests))
        done: list[Fetched] = []
        if not kept:
            for index, request in mine:
                done.append(await fetch(port, request, index, time_limit))
            return done
        sock = client_socket()
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            for index, request in mine:
                fetched = await fetch_on(sock, request, Fetched(index, time.time_ns()), time_limit)
                done.append(fetched)
                if fetched.error is not None:
                    break  # the connection is not usable any more
        except OSError as exc:
            done.append(Fetched(mine[len(done)][0], time.time_ns(), error=repr(exc)))
        finally:
            sock.close()
        # What was not sent fails its check.
        done += [Fetched(index, 0, error="not sent") for index, _ in mine[len(done) :]]
        return done

    per_client = await asyncio.gather(*(client(n, r) for n, r in enumerate(requests)))
    return [fetched for fetcheds in per_client for fetched in fetcheds]


# --- one relay ------------------------------------------------------------------------------


@dataclass
class Setup:
    args: argparse.Namespace
    texts: list[Text]
    gguf: Path
    upstream: Child
    upstream_port: int
    nginx: str | None
    tag: str


def start_relay(setup: Setup, scenario: Scenario) -> tuple[Child | None, int]:
    if scenario.relay == "nginx":
        assert setup.nginx is not None
        return start_nginx(setup.nginx, setup.upstream_port, setup.args.clients)
    if scenario.relay == "bare":
        return start_bare(setup.upstream_port)
    if scenario.relay in ("proxy", "proxy-retokenize"):
        mode = "retokenize" if scenario.relay == "proxy-retokenize" else "auto"
        launcher: tuple[str, ...] = ("-m", "proxy", "serve")
        if setup.args.steps is not None:
            setup.args.steps.mkdir(parents=True, exist_ok=True)
            out = setup.args.steps / f"steps-{scenario.key}.json"
            launcher = ("-m", "bench.request_steps", str(out), "--")
        return start_proxy(
            setup.upstream_port,
            setup.gguf,
            mode,
            scenario.verify,
            scenario.event_loop,
            launcher=launcher,
        )
    return None, setup.upstream_port


async def run_relay(setup: Setup, scenario: Scenario, run: int) -> list[dict[str, Any]]:
    args = setup.args
    relay, port = start_relay(setup, scenario)
    limit = 60 + 3 * args.tokens * args.pace_ms / 1000
    results = []
    try:
        warm = [request_bytes(scenario, port, 0, 2, 1, None)]
        warm += [
            request_bytes(scenario, port, i, 2, args.pace_ms, None) for i in range(args.clients)
        ]
        fetched = await wave(port, warm[:1], 0, limit)
        fetched += await wave(port, warm[1:], 0, limit)
        failed = [f.error or f.status for f in fetched if f.error or f.status != 200]
        for workload in workloads(args):
            result = await measure(setup, scenario, relay, port, workload, run)
            result["warmup_failures"] = failed[:5]
            results.append(result)
            print(
                f"  {scenario.key:<12} {workload.key:<12} {result['ok']}/{result['requests']} ok, "
                + (
                    f"{result['relay_us_per_request']:.0f} µs/request, "
                    if result["relay_us_per_request"] is not None
                    else ""
                )
                + f"TTFT p50 {_fmt(result['ttft_p50_ms'])} p99 {_fmt(result['ttft_p99_ms'])} ms "
                f"({result['wall_seconds']:.1f} s, "
                f"others {result['others_cpu_seconds']:.1f} CPU s)",
                flush=True,
            )
            for problem in result["problems"][:2]:
                print(f"    problem: {problem}")
    finally:
        if relay is not None:
            relay.stop()
    return results


async def measure(
    setup: Setup,
    scenario: Scenario,
    relay: Child | None,
    port: int,
    workload: Workload,
    run: int,
) -> dict[str, Any]:
    args = setup.args
    prefix = f"{setup.tag}/{run}/{scenario.key}/{workload.key}/"
    indexed = [
        (i, request_bytes(scenario, port, i, workload.tokens, args.pace_ms, f"{prefix}{i}"))
        for i in range(workload.requests)
    ]
    limit = 60 + 3 * workload.tokens * args.pace_ms / 1000
    profiler = None
    if args.profile is not None and relay is not None and scenario.relay.startswith("proxy"):
        name = args.profile / f"short-{scenario.key}-{workload.key}"
        profiler = start_py_spy(name, relay.pid, rate=1000)
    steps = args.steps is not None and relay is not None and scenario.relay.startswith("proxy")
    if steps:
        assert relay is not None
        os.kill(relay.pid, signal.SIGUSR1)  # bench/request_steps.py: counters to zero
        await asyncio.sleep(0.1)
    before = clocks(relay, setup.upstream)
    if workload.key == "burst":
        fetched = await wave(port, [r for _, r in indexed], args.ramp_ms / 1000, limit)
    else:
        per_client = [indexed[c :: args.clients] for c in range(args.clients)]
        fetched = await back_to_back(port, per_client, workload.connection == "kept", limit)
    after = clocks(relay, setup.upstream)
    if profiler is not None:
        profiler.proc.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
        profiler.proc.wait(60)
    step_times = None
    if steps:
        assert relay is not None
        out = args.steps / f"steps-{scenario.key}.json"
        out.unlink(missing_ok=True)
        os.kill(relay.pid, signal.SIGUSR2)  # ... written to `out`
        for _ in range(100):
            if out.exists() and out.stat().st_size:
                break
            await asyncio.sleep(0.05)
        step_times = json.loads(out.read_text())
    sent = fetch_sent(setup.upstream_port, prefix)
    checked = [
        check(scenario, cut(setup.texts[f.index % len(setup.texts)], workload.tokens), f,
              workload.tokens, sent.get(f"{prefix}{f.index}"))
        for f in fetched
    ]  # fmt: skip
    window = {key: after[key] - before[key] for key in before}
    measured = window["relay_cpu"] + window["upstream_cpu"] + window["client_cpu"]
    others = max(0.0, window["busy"] - measured)
    ok = [c for c in checked if c.problem is None]
    ttfts = sorted(c.ttft for c in ok if c.ttft is not None)
    relayed = scenario.relay != "none"
    cpu = window["relay_sched"] if relayed else None
    answered = len(ok)
    return {
        "run": run,
        "scenario": scenario.key,
        "workload": workload.key,
        "connection": workload.connection,
        "tokens_per_request": workload.tokens,
        "requests": len(checked),
        "ok": answered,
        "problems": [c.problem for c in checked if c.problem is not None][:5],
        "wall_seconds": window["wall"],
        "relay_cpu_seconds": cpu,
        "relay_cpu_stat_seconds": window["relay_cpu"] if relayed else None,
        "relay_us_per_request": cpu / answered * 1e6 if cpu is not None and answered else None,
        "requests_per_relay_cpu_second": answered / cpu if cpu else None,
        "upstream_cpu_seconds": window["upstream_cpu"],
        "client_cpu_seconds": window["client_cpu"],
        "others_cpu_seconds": others,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "profile": None if profiler is None else str(args.profile),
        # bench/request_steps.py: {step: [calls, CPU ns]} over the workload
        "steps": step_times,
    }


# --- the report -----------------------------------------------------------------------------


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Against nginx, the bare relay and direct of the same run and workload."""
    same: dict[tuple[int, str], dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for r in results:
        same[(r["run"], r["workload"])][r["scenario"]] = r
    for r in results:
        peers = same[(r["run"], r["workload"])]
        for name in ("nginx", "bare"):
            ref = peers.get(name, {}).get("relay_us_per_request")
            own = r["relay_us_per_request"]
            r[f"cpu_vs_{name}"] = own / ref if own is not None and ref else None
        direct = peers.get("direct")
        for key in ("ttft_p50_ms", "ttft_p99_ms"):
            base = None if direct is None else direct[key]
            value = r[key]
            added = value - base if value is not None and base is not None else None
            r[f"{key[:-3]}_added_ms"] = added


SUMMARIZED = (
    "relay_us_per_request",
    "requests_per_relay_cpu_second",
    "cpu_vs_nginx",
    "cpu_vs_bare",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "ttft_p50_added_ms",
    "ttft_p99_added_ms",
    "others_cpu_seconds",
)


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and relay: the median over the runs of each figure, and its range."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        groups[(r["workload"], r["scenario"])].append(r)
    rows = []
    for (workload, scenario), runs in groups.items():
        row: dict[str, Any] = {
            "workload": workload,
            "connection": runs[0]["connection"],
            "scenario": scenario,
            "runs": len(runs),
            "requests": sum(r["requests"] for r in runs),
            "failed": sum(r["requests"] - r["ok"] for r in runs),
        }
        for key in SUMMARIZED:
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[f"{key}_range"] = (min(values), max(values)) if values else None
        rows.append(row)
    return rows


def _span(row: dict[str, Any], key: str, shown: Callable[[float], str]) -> str | None:
    span = row[f"{key}_range"]
    if span is None or row["runs"] < 2:
        return None
    return f"{shown(span[0])}–{shown(span[1])}"


COLUMNS: list[Column] = [
    ("workload", lambda r: r["workload"]),
    ("connection", lambda r: r["connection"]),
    ("relay", lambda r: r["scenario"]),
    ("requests", lambda r: r["requests"]),
    ("failed", lambda r: r["failed"]),
    ("relay µs/request", lambda r: r["relay_us_per_request"]),
    ("requests per relay CPU-s", lambda r: r["requests_per_relay_cpu_second"]),
    ("x nginx", lambda r: times(r["cpu_vs_nginx"])),
    ("x nginx range", lambda r: _span(r, "cpu_vs_nginx", lambda v: f"{v:.2f}")),
    ("x bare", lambda r: times(r["cpu_vs_bare"])),
    ("TTFT p50", lambda r: r["ttft_p50_ms"]),
    ("TTFT p99", lambda r: r["ttft_p99_ms"]),
    ("added p50", lambda r: plus(r["ttft_p50_added_ms"])),
    ("added p99", lambda r: plus(r["ttft_p99_added_ms"])),
    ("others CPU s", lambda r: r["others_cpu_seconds"]),
]


def print_report(rows: list[dict[str, Any]]) -> None:
    print(
        "\nPer request (relay: the process tree between client and upstream, CPU from schedstat; "
        "x nginx, x bare: against theirs in the same run and workload; added: TTFT minus "
        "direct's; medians over the runs)\n"
        + table([name for name, _ in COLUMNS], [[get(r) for _, get in COLUMNS] for r in rows])
    )


# --- the steps of a request -----------------------------------------------------------------


def print_steps(results: list[dict[str, Any]]) -> None:
    """bench/request_steps.py's timings: CPU µs per request of each step (inclusive)."""
    for r in results:
        if not r["steps"] or not r["ok"]:
            continue
        rows = [
            [step, calls / r["ok"], ns / r["ok"] / 1000] for step, (calls, ns) in r["steps"].items()
        ]
        print(
            f"\nSteps of a request, CPU time in place: {r['scenario']}, {r['workload']} "
            f"({r['ok']} requests one at a time; process: all its CPU)\n"
            + table(["step", "calls per request", "µs per request"], rows)
        )


# --- main -----------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    print(f"machine: {info['nproc']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    gguf = assets.SMOLLM2_GGUF.ensure()
    vocabulary = Vocabulary.build(load_tokenizer(gguf))
    texts = make_texts(vocabulary, max(args.tokens, args.burst_tokens), TEXTS)
    path = texts_file(texts, max(args.tokens, args.burst_tokens))
    nginx = nginx_binary()
    scenarios = [RELAYS[key] for key in args.scenarios]
    skipped = []
    if nginx is None and any(s.relay == "nginx" for s in scenarios):
        print("nginx is not installed: skipped (apt-get install nginx-light to include it)")
        scenarios = [s for s in scenarios if s.relay != "nginx"]
        skipped.append("nginx: not installed")
    raise_fd_limit(max(args.burst, args.clients))
    upstream_port = free_port()
    upstream_args = [
        "-m", "bench.paced_upstream",
        "--streams-file", str(path),
        "--port", str(upstream_port),
        "--pace-ms", str(args.pace_ms),
    ]  # fmt: skip
    upstream = spawn("paced upstream", upstream_args, bench_cache_dir() / "short-upstream.log")
    wait_http_ok(upstream, f"http://127.0.0.1:{upstream_port}/health")
    setup = Setup(args, texts, gguf, upstream, upstream_port, nginx, f"short{os.getpid()}")
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        for run_number in range(args.runs):
            print(f"\nrun {run_number + 1} of {args.runs}", flush=True)
            # Each run rotates the relays' order, so none is always measured first.
            turn = run_number % len(scenarios)
            for scenario in scenarios[turn:] + scenarios[:turn]:
                results += await run_relay(setup, scenario, run_number)
    finally:
        upstream.stop()
    add_ratios(results)
    rows = summarize(results)
    order = {key: n for n, key in enumerate(args.scenarios)}
    rows.sort(key=lambda r: (args.workloads.index(r["workload"]), order[r["scenario"]]))
    print_report(rows)
    print_steps(results)
    failed = [
        f"run {r['run']}, {r['scenario']}, {r['workload']}: {r['requests'] - r['ok']} failed "
        f"{r['problems'][:2]}"
        for r in results
        if r["ok"] != r["requests"]
    ] + [
        f"run {r['run']}, {r['scenario']}: warm-up failed: {r['warmup_failures']}"
        for r in results
        if r["warmup_failures"]
    ]
    verdict = "CHECKS FAILED:\n  " + "\n  ".join(failed) if failed else "every response verified"
    print("\n" + verdict)
    info["loadavg_at_end"] = loadavg()
    info["commit_at_end"] = git_commit()
    return {
        "benchmark": "short",
        "mode": "quick" if args.quick else "full",
        "command": "python bench/short.py " + " ".join(sys.argv[1:]),
        "duration_seconds": time.monotonic() - started,
        "machine": info,
        "settings": {key: getattr(args, key) for key in SETTINGS} | {"skipped": skipped},
        "summary": rows,
        "results": results,
        "failed": failed,
    }


SETTINGS = (
    "runs", "burst", "burst_tokens", "clients", "requests", "tokens", "pace_ms", "ramp_ms",
    "scenarios", "workloads",
)  # fmt: skip


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--runs", type=int, default=1, help="runs of every relay (medians)")
    parser.add_argument("--burst", type=int, help="burst: streams (500; quick 100)")
    parser.add_argument("--burst-tokens", type=int, default=2, help="burst: tokens each (2)")
    parser.add_argument("--clients", type=int, default=32, help="clients-*: clients (32)")
    parser.add_argument("--requests", type=int, help="clients-*: requests per client (16; quick 4)")
    parser.add_argument("--tokens", type=int, default=16, help="clients-*: tokens each (16)")
    parser.add_argument("--pace-ms", type=float, default=10.0, help="between events (10)")
    parser.add_argument("--ramp-ms", type=float, default=1000.0, help="burst: started over (1000)")
    parser.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        default=list(DEFAULT_SCENARIOS),
        help=f"relays, comma-separated, of {','.join(RELAYS)} "
        f"(default {','.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--workloads",
        type=lambda s: s.split(","),
        default=list(WORKLOADS),
        help=f"comma-separated, of {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="py-spy on the proxy (collapsed stacks)"
    )
    parser.add_argument(
        "--steps",
        type=Path,
        metavar="DIR",
        help="time the steps of a request in the proxy (bench/request_steps.py); send the "
        "requests one at a time: --clients 1 --workloads clients-kept,clients-new",
    )
    parser.add_argument("--json", type=Path, help="results file (default bench/results/short.json)")
    args = parser.parse_args(argv)
    args.scenarios = list(dict.fromkeys(args.scenarios))
    unknown = [k for k in args.scenarios if k not in RELAYS] + [
        k for k in args.workloads if k not in WORKLOADS
    ]
    if unknown:
        parser.error(f"unknown scenarios or workloads: {unknown}")
    for name, full, short in (("burst", 500, 100), ("requests", 16, 4)):
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    with cleanup_on_exit():
        payload = asyncio.run(run(args))
    write_results(args.json or results_path("short", quick=args.quick), payload)
    return 1 if payload["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
