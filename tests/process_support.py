"""`codec-proxy serve` as a real process on a free port, for the tests that need one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
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
