"""The README's vLLM recipe ("Point it at your own backend", `### vLLM`), run as written.

The block's two commands are read from README.md itself: vLLM's, then the proxy's. Only what
names this machine changes: the model directory (the one tests/vllm/backend.py converted), the
ports (free ones), the interpreters (vLLM's virtualenv, the project's) and the traces endpoint
(the test's receiver); a placeholder the README no longer writes fails the test. What else
the tests add is appended and says why (tests/vllm/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The placeholders the README writes, as a reader would replace them.
MODEL = "/models/SmolLM2-135M-Instruct"
VLLM_PORT, PROXY_PORT, ADMIN_PORT = "8000", "8080", "8081"
COLLECTOR = "http://127.0.0.1:4318"
# What a `make test-vllm` log of vLLM's shows last when it fails: enough for a traceback.
LOG_TAIL = 6000


@dataclass(frozen=True)
class Command:
    env: dict[str, str]  # the `NAME=value` words before the program
    argv: list[str]


def readme_commands() -> tuple[Command, Command]:
    """vLLM's and the proxy's command, from the README's vLLM block."""
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if "vllm.entrypoints.openai.api_server" in b]
    lines = block.replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words and words[-1] == "&":  # vLLM runs in the background of the recipe
            words.pop()
        commands.append(Command(env, words))
    vllm, proxy = commands
    return vllm, proxy


def substituted(words: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """`words` with each placeholder replaced: whole words (ports) and URL and path prefixes.
    Every placeholder must be there, or the command would run with the README's value."""
    out, used = [], set()
    for word in words:
        for placeholder, value in values.items():
            prefix = placeholder.startswith(("http://", "/", "."))
            if word == placeholder or (prefix and word.startswith(placeholder)):
                word = value + word[len(placeholder) :]
                used.add(placeholder)
                break
        out.append(word)
    assert used == set(values), f"not in the README's command {words}: {set(values) - used}"
    return out


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class Process:
    """One of the recipe's commands as a child process in a session of its own (vLLM starts
    an engine and a worker process under it: `stop` ends them all), its output in `log`."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log: Path, name: str) -> None:
        self.name, self.log = name, log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-LOG_TAIL:]

    def wait_until(self, url: str, timeout: float) -> float:
        """Seconds until `url` answers 200; fails loudly, with the log, if it exits or times out."""
        started = time.monotonic()
        while _get(url) != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; its log ({self.log}) ends:\n"
                    + self.tail()
                )
            if time.monotonic() - started > timeout:
                self.stop()
                raise RuntimeError(
                    f"{self.name}: {url} not ready after {timeout:.0f} s; its log ends:\n"
                    + self.tail()
                )
            time.sleep(0.25)
        return time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        # Whatever of its session is left (vLLM's engine and worker), the leader gone or not.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return self.proc.returncode


def codec_proxy() -> str:
    """The README's `.venv/bin/codec-proxy`: the one beside this interpreter."""
    return str(Path(sys.executable).with_name("codec-proxy"))
