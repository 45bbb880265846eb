"""The differential fuzz (test_native_differential.py) once more, on a build of the native step
with AddressSanitizer and UndefinedBehaviorSanitizer: a read past a buffer, a use after free or
an undefined shift or overflow in the C step stops the run, where the plain build could return
the right bytes by luck. Bounded: FUZZ_STREAMS streams per fuzz test (about a minute).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from proxy.core.steady import NATIVE
from proxy.native import SOURCE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="built without the native steady path")

ROOT = Path(__file__).resolve().parents[2]
SANITIZED_STREAMS = "15"
# The sanitized module is loaded under the real one's name before anything imports it.
RUNNER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("proxy.core.steady._steady", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules[spec.name] = module
import pytest
from proxy.core.steady import NATIVE
assert NATIVE is module, NATIVE
sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *sys.argv[2:]]))
"""


def sanitized_build(directory: Path) -> Path:
    gcc = shutil.which("gcc")
    assert gcc is not None, "gcc builds the native step; it is there wherever that was built"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    out = directory / "_steady.so"
    subprocess.run(
        [
            gcc,
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            f'-DSTEADY_SOURCE_HASH="{digest}"',
            str(SOURCE),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


def test_the_fuzz_runs_clean_under_the_sanitizers(tmp_path: Path) -> None:
    library = sanitized_build(tmp_path)
    asan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    env = {
        **os.environ,
        # ASan's runtime must be loaded first; CPython's own allocations go through malloc so
        # that ASan sees the buffers the step is handed; CPython's leaks at exit are not ours.
        "LD_PRELOAD": asan,
        "PYTHONMALLOC": "malloc",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "FUZZ_STREAMS": SANITIZED_STREAMS,
    }
    env.pop("CODEC_PROXY_NO_EXTENSIONS", None)
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(library), "tests/server/test_native_differential.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = result.stdout[-3000:] + result.stderr[-6000:]
    assert result.returncode == 0, report
    assert "passed" in result.stdout, report
    assert "failed" not in result.stdout, report
