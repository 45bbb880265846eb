"""The embedded default backend: a real llama.cpp server (the `xllamacpp` wheel) in a child process.

`xllamacpp` embeds llama.cpp's C++ HTTP server, with the same routes as `llama-server`. It runs
in its own process so that its threads and its memory never share an event loop with the
proxy, and so that Ctrl-C or SIGTERM can stop it cleanly.

    python -m proxy.embedded MODEL.gguf PORT      # the child; prints "listening <url>"
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedBackendError(RuntimeError):
    """The llama.cpp child process did not start or did not become healthy."""


class EmbeddedBackend:
    """Start, health-check and stop a llama.cpp server child process on 127.0.0.1."""

    def __init__(
        self,
        model: Path,
        *,
        port: int | None = None,
        parallel: int = 2,
        ctx_size: int = 4096,
        log_path: Path | None = None,
    ) -> None:
        self.model = model
        self.port = port or free_port()
        self.parallel = parallel
        self.ctx_size = ctx_size
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "proxy.embedded", str(self.model), str(self.port)]
        cmd += [str(self.parallel), str(self.ctx_size)]
        with self.log_path.open("ab") if self.log_path else open(os.devnull, "wb") as log:
            # A new session keeps a terminal's Ctrl-C away from the child: the parent stops it.
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EmbeddedBackendError(
                    f"llama.cpp server exited with code {self._proc.returncode}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if self._healthy():
                return
            time.sleep(0.1)
        self.stop()
        raise EmbeddedBackendError(f"llama.cpp server not healthy after {timeout:.0f}s")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedBackend:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _serve(model: str, port: int, parallel: int, ctx_size: int) -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = ctx_size
    params.n_parallel = parallel
    # Leave one core to the proxy: llama.cpp's threads wait for each other at every step, so
    # one of them preempted by the proxy (or a test) stalls generation for everyone.
    threads = max(1, min(4, (os.cpu_count() or 1) - 1))
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.hostnames = ["127.0.0.1"]
    params.port = port  # the default, 0, serves no HTTP at all
    params.endpoint_metrics = True
    params.endpoint_slots = True
    server = xllamacpp.Server(params)
    print("listening", server.listening_address, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    _serve(
        args[0],
        int(args[1]),
        int(args[2]) if len(args) > 2 else 2,
        int(args[3]) if len(args) > 3 else 4096,
    )
