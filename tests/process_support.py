"""`codec-proxy serve` as a real process on a free port, for the tests that need one; which of
its workers listen, and which one holds a connection (Linux /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from proxy.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent


class ServeProcess:
    """`python -m proxy serve --port <free> --log-format text ARGS...`, run from this checkout;
    `env`: variables added to this process's."""

    def __init__(self, *args: str, env: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", str(self.port),
             "--log-format", "text", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            # Its own process group: `stop` takes the workers too, which hold the output pipe.
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, url: str | None = None) -> None:
        """Until `/readyz` at `url` (default: the serving port's) answers 200."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.stop()[-3000:]
                raise AssertionError(f"proxy exited with {self.proc.returncode}:\n{out}")
            try:
                with urllib.request.urlopen((url or self.url) + "/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"proxy did not become ready:\n{self.stop()[-3000:]}")

    def stop(self) -> str:
        """Kill it (and its workers) if it still runs; everything it printed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        out, _ = self.proc.communicate(timeout=30)
        return out


def children(pid: int) -> list[int]:
    """Process `pid`'s children: a supervisor's workers, and multiprocessing's resource
    tracker."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    return inodes


def _tcp_sockets() -> Iterator[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of every TCP socket of this machine."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
            yield local, remote, fields[3], fields[9]


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` has a listening socket on."""
    held = _socket_inodes(pid)
    return {local for local, _, state, inode in _tcp_sockets() if state == "0A" and inode in held}


def workers_listen(proxy: ServeProcess, workers: int) -> None:
    """Until `workers` children of `proxy` listen on its port. /readyz answers as soon as one
    worker serves, and the kernel gives every connection to it until the others listen too."""
    deadline = time.monotonic() + 90
    while sum(proxy.port in listening_ports(child) for child in children(proxy.proc.pid)) < workers:
        assert time.monotonic() < deadline, f"fewer than {workers} workers ever listened"
        time.sleep(0.1)


def serving_worker(proxy: ServeProcess, client_port: int) -> int:
    """The worker of `proxy` that holds the connection a client made from `client_port`."""
    [inode] = [
        inode
        for local, remote, state, inode in _tcp_sockets()
        if (local, remote, state) == (proxy.port, client_port, "01")  # 01: ESTABLISHED
    ]
    [worker] = [pid for pid in children(proxy.proc.pid) if inode in _socket_inodes(pid)]
    return worker
