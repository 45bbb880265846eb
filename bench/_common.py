"""Shared plumbing for the benchmark scripts: machine facts, processes, CPU clocks, results.

Nothing here measures anything by itself. The scripts (`bench/wire.py`, `bench/throughput.py`)
print tables and write one JSON record each to `bench/results/`; they never assert timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def bench_cache_dir() -> Path:
    """Where recordings are cached: `<cache>/bench` (git-ignored, next to the model)."""
    from proxy.assets import cache_dir

    path = cache_dir() / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- machine --------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    """HEAD (and whether proxy/ has local changes); CODEC_BENCH_COMMIT names an exported tree."""
    if configured := os.environ.get("CODEC_BENCH_COMMIT"):
        return configured
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "proxy"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip() + ("+dirty(proxy)" if dirty.stdout.strip() else "")
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on. `loadavg` shows whether the machine was shared."""
    return {
        "nproc": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            name: _version(name)
            for name in ("aiohttp", "msgpack", "protobuf", "tokenizers", "xllamacpp")
        },
        "git_commit": git_commit(),
        "loadavg_at_start": loadavg(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# --- CPU clocks -----------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def process_schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one), all threads (schedstat(5)).

    Nanosecond clocks, unlike /proc/<pid>/stat's ticks: fine for one request. On a shared
    machine the wait is how long other work kept the process from running, latency the
    process did not cause.
    """
    running = waiting = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (task / "schedstat").read_text().split()
            running += int(fields[0])
            waiting += int(fields[1])
    return running / 1e9, waiting / 1e9


def machine_busy_seconds() -> float:
    """CPU seconds all processes on the machine spent busy (every core), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def self_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# --- processes seen from /proc --------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants (a supervisor's workers), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree = [pid]
    for parent in tree:  # grows while it is walked: breadth first
        tree.extend(sorted(children.get(parent, ())))
    return tree


def process_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict (`VmRSS`: "123456 kB", `Threads`: "3", ...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def process_rss_bytes(pid: int) -> int:
    """Resident memory (VmRSS) of one process."""
    return int(process_status(pid)["VmRSS"].split()[0]) * 1024


def open_fds(pid: int) -> list[str]:
    """What each open file descriptor of a process points to (`socket:[inode]`, a path...)."""
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            targets.append(os.readlink(fd))
    return targets


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str  # proc(5) names: ESTABLISHED, LISTEN, CLOSE_WAIT, TIME_WAIT, ...


_TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
    "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}  # fmt: skip


def tcp_sockets() -> dict[int, TcpSocket]:
    """Every TCP socket of this network namespace by inode (/proc/net/tcp and tcp6).

    Match them with `open_fds()` (`socket:[inode]`) to see which process holds which.
    Sockets without an owner (TIME_WAIT) have inode 0 and are left out.
    """
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                inode = int(fields[9])
                if inode:
                    sockets[inode] = TcpSocket(
                        int(fields[1].rsplit(":", 1)[1], 16),
                        int(fields[2].rsplit(":", 1)[1], 16),
                        _TCP_STATES.get(fields[3], fields[3]),
                    )
    return sockets


# --- child processes ------------------------------------------------------------------------


@dataclass
class Child:
    """A child process the benchmark started and must stop."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Stop functions of everything started, run by `cleanup_on_exit` whatever happens in between
# (an exception, Ctrl-C, SIGTERM arriving in the middle of the event loop).
_CLEANUPS: list[Callable[[], None]] = []


def register_cleanup(stop: Callable[[], None]) -> None:
    """`stop` must be idempotent: it also runs if the normal path already stopped the thing."""
    _CLEANUPS.append(stop)


@contextlib.contextmanager
def cleanup_on_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit; on the way out, stop every child process we started.

    Synchronous on purpose: a signal can land anywhere inside asyncio, which then may never
    reach a coroutine's `finally`. This runs after `asyncio.run` has returned or raised.
    """

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while _CLEANUPS:
            with contextlib.suppress(Exception):
                _CLEANUPS.pop()()
        signal.signal(signal.SIGTERM, previous)


def spawn(
    name: str,
    args: Sequence[str],
    log: Path,
    *,
    program: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Child:
    """`python <args>` (or `<program> <args>`) from the repo root, output to `log`, in its own
    session; `env`: variables set besides this process's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(program or sys.executable), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )
    child = Child(name, proc, log)
    register_cleanup(child.stop)
    return child


def wait_http_ok(child: Child, url: str, timeout: float = 60.0) -> None:
    """Poll `url` until it answers 200; fail early if the child died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            tail = child.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{tail}")
        with contextlib.suppress(urllib.error.URLError, OSError):
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.1)
    child.stop()
    raise RuntimeError(f"{child.name} not ready at {url} after {timeout:.0f}s; see {child.log}")


# --- output ---------------------------------------------------------------------------------


def results_path(name: str, *, quick: bool) -> Path:
    """Full runs are the record (`<name>.json`); quick runs never overwrite it."""
    return RESULTS_DIR / (f"{name}-quick.json" if quick else f"{name}.json")


def write_results(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nresults written to {shown}")


# A report column: its header and how a result row's value is read.
Column = tuple[str, Callable[[dict[str, Any]], object]]


def times(value: float | None) -> str | None:
    """A ratio as a table shows it: `1.52x`."""
    return None if value is None else f"{value:.2f}x"


def plus(value: float | None) -> str | None:
    """A difference as a table shows it: `+0.34`."""
    return None if value is None else f"{value:+.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pastes straight into docs/BENCHMARKS.md); numbers right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if num else ("-" * (w + 2))
        for w, num in zip(widths, numeric, strict=True)
    )
    return "\n".join([line(headers), rule + "|", *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def tokenizer_arguments(description: str) -> argparse.Namespace:
    """`--tokenizer` (default: the bundled SmolLM2 GGUF, fetched once) and `--tokens`, the
    arguments every single-tokenizer benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokenizer", type=Path, help="default: the bundled SmolLM2 GGUF")
    parser.add_argument("--tokens", type=int, default=20000)
    args = parser.parse_args()
    if args.tokenizer is None:
        from proxy import assets

        args.tokenizer = assets.SMOLLM2_GGUF.ensure()
    return args
