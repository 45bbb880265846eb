""".ci/run, the CI entry point: prometheus installed when missing, its failure fatal in CI only.

Each case runs a copy of the script in a sandbox checkout whose Makefile only records which
targets ran, with a PATH holding nothing but what the script needs and a stub `apt-get`.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("promtool", "prometheus")


@dataclasses.dataclass(frozen=True)
class Run:
    status: int
    output: str
    targets: list[str]
    apt_calls: list[str]


def stub(path: Path, script: str) -> None:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def run_ci(
    tmp_path: Path,
    *,
    ci: str | None,
    apt: str,
    installed: bool = False,
    lint: str = "true",
    test: str = "true",
) -> Run:
    """.ci/run in a sandbox; `apt` is the stub apt-get's shell script, `lint` and `test` the
    first command of those recipes."""
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    (checkout / "Makefile").write_text(
        f"lint:\n\t{lint}; echo lint >> ran\ntest:\n\t{test}; echo test >> ran\n"
        "test-vllm:\n\techo test-vllm >> ran\n"
    )
    bin_dir.mkdir()
    for tool in ("bash", "make", "dirname"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    log = tmp_path / "apt-calls"
    stub(bin_dir / "apt-get", f'echo "$*" >> {log}\n{apt}')
    if installed:
        for tool in TOOLS:
            stub(bin_dir / tool, "exit 0")
    env = {"PATH": str(bin_dir), "BIN": str(bin_dir)}
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [str(checkout / ".ci" / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ran = checkout / "ran"
    return Run(
        done.returncode,
        done.stdout + done.stderr,
        ran.read_text().split() if ran.exists() else [],
        log.read_text().splitlines() if log.exists() else [],
    )


# What the stub apt-get does: fail, or succeed and put the tools on PATH (as the package does).
APT_FAILS = "exit 100"
APT_INSTALLS = (
    'case "$1" in install) for t in promtool prometheus; do '
    f'printf "#!/bin/sh\\nexit 0\\n" > "$BIN/$t"; {shutil.which("chmod")} 755 "$BIN/$t"; '
    "done;; esac"
)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_failed_install_fails_the_run(tmp_path: Path, ci: str) -> None:
    run = run_ci(tmp_path, ci=ci, apt=APT_FAILS)
    assert run.status != 0, run
    assert "its tests must run in CI" in run.output
    assert run.targets == []


def test_in_ci_an_install_without_the_tools_fails_the_run(tmp_path: Path) -> None:
    run = run_ci(tmp_path, ci="true", apt="exit 0")
    assert run.status != 0, run
    assert run.targets == []


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_failed_install_is_one_line_and_the_run_goes_on(
    tmp_path: Path, ci: str | None
) -> None:
    run = run_ci(tmp_path, ci=ci, apt=APT_FAILS)
    assert run.status == 0, run
    assert "prometheus not installed: its tests will skip" in run.output
    assert run.targets == ["lint", "test", "test-vllm"]


def test_in_ci_the_tools_are_installed_then_lint_and_tests_run(tmp_path: Path) -> None:
    run = run_ci(tmp_path, ci="true", apt=APT_INSTALLS)
    assert run.status == 0, run
    assert [call.split()[0] for call in run.apt_calls] == ["update", "install"]
    assert "prometheus" in run.apt_calls[1].split()
    assert run.targets == ["lint", "test", "test-vllm"]


def test_installed_tools_are_not_installed_again(tmp_path: Path) -> None:
    run = run_ci(tmp_path, ci="true", apt=APT_FAILS, installed=True)
    assert run.status == 0, run
    assert run.apt_calls == []
    assert run.targets == ["lint", "test", "test-vllm"]


def test_a_failing_lint_stops_the_run(tmp_path: Path) -> None:
    run = run_ci(tmp_path, ci="true", apt=APT_FAILS, installed=True, lint="exit 2")
    assert run.status != 0, run
    assert run.targets == []


def test_failing_tests_stop_the_run_before_the_vllm_tests(tmp_path: Path) -> None:
    run = run_ci(tmp_path, ci="true", apt=APT_FAILS, installed=True, test="exit 1")
    assert run.status != 0, run
    assert run.targets == ["lint"]
