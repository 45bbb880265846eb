"""A real vLLM (CPU build, SmolLM2-135M-Instruct) for the tests in this folder, one per session.

These tests run under `make test-vllm` only (`-m vllm`); `make test` leaves them out (`-m "not
vllm"`). Every test here must carry the `vllm` mark, or `make test` would start vLLM: the
`_marked` fixture fails one that does not.

vLLM is started from the README's recipe (tests/vllm/recipe.py), its traces sent to a port
reserved for the session, where a test's OTLP receiver listens while it needs them. Start-up
time and memory go to `.cache/reports/vllm-backend.json`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy import assets
from proxy.embedded import free_port
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests.vllm import backend
from tests.vllm.recipe import (
    COLLECTOR,
    MODEL,
    VLLM_PORT,
    Process,
    readme_commands,
    substituted,
)

SERVED_NAME = "smollm2"
# Added to the README's command for the tests' sake:
TEST_FLAGS = (
    # Each request computes its prompt from scratch, as the llama.cpp tests ask with
    # `cache_prompt: false`: a prompt half read from the cache is computed in other shapes,
    # which in bfloat16 can tip a near tie between two tokens at temperature 0.
    "--no-enable-prefix-caching",
)
TEST_ENV = {
    # vLLM's span processor sends every 50 ms instead of every 5 s.
    "OTEL_BSP_SCHEDULE_DELAY": "50",
}
# Seconds: 25 on a quiet 2-core machine, two minutes and more on a loaded one.
STARTUP_TIMEOUT = 600.0


@pytest.fixture(autouse=True)
def _marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("vllm") is not None, (
        f"{request.node.nodeid} is in tests/vllm but not marked `vllm`: `make test` would run it"
    )


@dataclass(frozen=True)
class Vllm:
    url: str
    model_dir: Path  # the Hugging Face directory it serves, tokenizer.json included
    otlp_port: int  # where its spans go: an OTLP/HTTP receiver's port, `/v1/traces`


def _pss_kib(pid: int) -> int:
    """Proportional set size of `pid` and every process under it, in KiB (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue  # it exited meanwhile
    return total


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    model_dir = backend.ensure_model()
    python = backend.ensure_venv()
    port, otlp_port = free_port(), free_port()
    command, _ = readme_commands()
    values = {
        "python": str(python),
        MODEL: str(model_dir),
        VLLM_PORT: str(port),
        COLLECTOR: f"http://127.0.0.1:{otlp_port}",
    }
    argv = substituted(command.argv, values) + list(TEST_FLAGS)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    process = Process(argv, {**command.env, **TEST_ENV}, log, "vLLM")
    url = f"http://127.0.0.1:{port}"
    try:
        startup = process.wait_until(f"{url}/v1/models", STARTUP_TIMEOUT)
        report = assets.cache_dir() / "reports" / "vllm-backend.json"
        report.parent.mkdir(exist_ok=True)
        figures = {
            "vllm": backend.VLLM_VERSION,
            "startup_seconds": round(startup, 1),
            "pss_mib_after_startup": round(_pss_kib(process.proc.pid) / 1024),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        report.write_text(json.dumps(figures, indent=2) + "\n")
        yield Vllm(url, model_dir, otlp_port)
    finally:
        process.stop()


@pytest.fixture(scope="session")
def vllm_vocabulary(vllm_server: Vllm) -> Vocabulary:
    """The proxy's tokenizer read from the directory vLLM serves, as the README's recipe has it."""
    return Vocabulary.build(load_tokenizer(vllm_server.model_dir))
