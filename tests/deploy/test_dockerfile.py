"""deploy/Dockerfile passes its lint, and the lint catches what it is for."""

from __future__ import annotations

import dataclasses
import http.server
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import dockerfile
from proxy import config
from proxy.embedded import free_port
from proxy.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
IGNORE = DEPLOY / "Dockerfile.dockerignore"


def lint_variant(tmp_path: Path, old: str, new: str, *, ignore: str | None = None) -> list[str]:
    """Lint a copy of the Dockerfile with `old` replaced by `new` (which must occur)."""
    text = DOCKERFILE.read_text()
    assert old in text, old
    (tmp_path / "Dockerfile").write_text(text.replace(old, new))
    (tmp_path / "Dockerfile.dockerignore").write_text(
        IGNORE.read_text() if ignore is None else ignore
    )
    return dockerfile.lint(dockerfile.parse(tmp_path / "Dockerfile"))


def test_the_dockerfile_passes() -> None:
    assert dockerfile.lint(dockerfile.parse(DOCKERFILE)) == []


def test_the_command_line_exits_by_the_result(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "deploy.dockerfile", "lint"], cwd=REPO, check=False)
    assert ok.returncode == 0
    lint_variant(tmp_path, "USER 10001:10001", "USER root")
    bad = subprocess.run(
        [sys.executable, "-m", "deploy.dockerfile", "lint", str(tmp_path / "Dockerfile")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert "USER root" in bad.stdout


BASE = "ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm"


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        (BASE, "ARG PYTHON_IMAGE=python:3.11-slim", "is not pinned"),
        (BASE, "ARG PYTHON_IMAGE=python", "is not pinned"),
        (BASE, "ARG PYTHON_IMAGE=python:latest", "'latest'"),
        ("USER 10001:10001", "", "sets no USER"),
        ("USER 10001:10001", "USER 0", "is root"),
        ("USER 10001:10001", "USER 10001:0", "is root"),
        ("USER 10001:10001", "USER codec-proxy", "numeric"),
        ("    CODEC_PROXY_HOST=0.0.0.0", "    CODEC_PROXY_API_KEY=abc", "CODEC_PROXY_API_KEY"),
        ("ARG VERSION=0.1.0", "ARG HF_TOKEN", "HF_TOKEN"),
        ("ARG VERSION=0.1.0", "ARG VERSION=0.1.0\nENV DB_PASSWORD=hunter2", "DB_PASSWORD"),
        ("COPY proxy ./proxy", "COPY proxy ./proxy\nCOPY .env ./", "credentials file"),
        ("COPY proxy ./proxy", "COPY proxy ./proxy\nCOPY deploy/id_rsa /root/", "credentials"),
        ("COPY proxy ./proxy", "COPY . .", "whole build context"),
        ("COPY proxy ./proxy", "ADD https://example.com/x.tgz ./", "ADD https://"),
        ("LABEL org", "# AKIAABCDEFGHIJKLMNOP\nLABEL org", "literal credential"),
        ('ENTRYPOINT ["codec-proxy", "serve"]', "ENTRYPOINT codec-proxy serve", "entry point"),
        ("HEALTHCHECK --interval", "# HEALTHCHECK --interval", "HEALTHCHECK"),
        ("RUN useradd", "RUN apt-get install -y gcc && useradd", "compiler"),
    ],
)
def test_each_problem_is_caught(tmp_path: Path, old: str, new: str, problem: str) -> None:
    problems = lint_variant(tmp_path, old, new)
    assert any(problem in p for p in problems), problems


def test_a_path_to_a_secret_file_is_no_secret(tmp_path: Path) -> None:
    variant = "    CODEC_PROXY_HOST=0.0.0.0 CODEC_PROXY_API_KEY_FILE=/run/secrets/keys"
    assert lint_variant(tmp_path, "    CODEC_PROXY_HOST=0.0.0.0", variant) == []


def test_a_digest_pins_the_base(tmp_path: Path) -> None:
    digest = "python:3.11-slim@sha256:" + "0" * 64
    assert lint_variant(tmp_path, BASE, f"ARG PYTHON_IMAGE={digest}") == []


@pytest.mark.parametrize("ignore", ["", "*\n!proxy/\n!.env\n", ".git\n.venv\n"])
def test_the_context_must_leave_out_credentials(tmp_path: Path, ignore: str) -> None:
    problems = lint_variant(tmp_path, "USER", "USER", ignore=ignore)
    assert any("not excluded from the build context" in p for p in problems), problems


def test_the_ignore_file_keeps_what_the_build_copies() -> None:
    rules = dockerfile.IgnoreRules.read(IGNORE)
    for kept in ("pyproject.toml", "README.md", "proxy/server/app.py", "proxy/py.typed"):
        assert not rules.ignored(kept), kept
    for left_out in (".env", "proxy/.env", ".env.prod", ".git/HEAD", ".venv/bin/python",
                     ".cache/models/x.gguf", "tests/conftest.py", "proxy/__pycache__/a.pyc",
                     "deploy/Dockerfile"):  # fmt: skip
        assert rules.ignored(left_out), left_out


def test_the_images_environment_is_made_of_real_settings() -> None:
    parsed = dockerfile.parse(DOCKERFILE)
    env = parsed.env(parsed.final)
    ours = {k: v for k, v in env.items() if k.startswith(config.ENV_PREFIX)}
    assert ours == {"CODEC_PROXY_HOST": "0.0.0.0"}
    # Accepted by the proxy's loader (an unknown CODEC_PROXY_* variable stops the start).
    settings = config.load(
        env={**ours, "CODEC_PROXY_UPSTREAM": "http://u", "CODEC_PROXY_TOKENIZER": "t"}
    )
    assert settings.host == "0.0.0.0"


def test_exposed_and_health_checked_port_is_the_default_port() -> None:
    default = {f.name: f.default for f in dataclasses.fields(Settings)}["port"]
    final = dockerfile.parse(DOCKERFILE).final
    (expose,) = final.all("EXPOSE")
    assert expose.args == str(default)
    (check,) = final.all("HEALTHCHECK")
    fallback = re.search(r"get\('CODEC_PROXY_PORT', '(\d+)'\)", check.args)
    assert fallback is not None
    assert int(fallback.group(1)) == default


@pytest.fixture
def livez_port() -> Iterator[int]:
    """A port where GET /livez answers 200 (and anything else 404)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/livez" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("variables", "healthy"),
    [
        ({"CODEC_PROXY_PORT": "{live}"}, True),
        ({"CODEC_PROXY_PORT": "{dead}"}, False),
        # With an admin port, /livez is there only (the serving port relays that path upstream).
        ({"CODEC_PROXY_PORT": "{dead}", "CODEC_PROXY_ADMIN_PORT": "{live}"}, True),
        ({"CODEC_PROXY_PORT": "{live}", "CODEC_PROXY_ADMIN_PORT": "{dead}"}, False),
    ],
)
def test_the_health_check_asks_the_port_livez_is_on(
    livez_port: int, variables: dict[str, str], healthy: bool
) -> None:
    (check,) = dockerfile.parse(DOCKERFILE).final.all("HEALTHCHECK")
    command = dockerfile.Instruction("CMD", check.args[check.args.index("CMD") + 3 :].strip(), 0)
    python, *rest = command.exec_form() or []
    assert python == "python"
    dead = free_port()  # nothing listens there
    env = {k: v.format(live=livez_port, dead=dead) for k, v in variables.items()}
    result = subprocess.run([sys.executable, *rest], env=env, capture_output=True, check=False)
    assert (result.returncode == 0) is healthy, result.stderr


def test_continuations_comments_and_variables_are_read_as_docker_does(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG BASE=python:3.11.9-slim\n"
        "FROM ${BASE} AS build\n"
        "ENV A=/opt/a \\\n"
        "    # a comment inside a continuation\n"
        '    B="$A/bin two"\n'
        "ENV C $B\n"
        "FROM build\n"
    )
    parsed = dockerfile.parse(path)
    assert [s.base for s in parsed.stages] == ["python:3.11.9-slim", "build"]
    assert parsed.env(parsed.stages[0]) == {
        "A": "/opt/a",
        "B": "/opt/a/bin two",
        "C": "/opt/a/bin two",
    }
