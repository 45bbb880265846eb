"""deploy/Dockerfile's build steps, run as written in a fresh virtualenv, make a working image:
the entry point serves as the image's USER (uid 10001), the HEALTHCHECK command tells up from
down, SIGTERM drains and exits 0, all on a read-only root with a tmpfs on TMPDIR.

Running as another uid and the read-only root need root (setpriv, a mount namespace), as CI
has; the interpreter standing in for the image's must be one that uid can run: this one, or the
system's of the same version when this one lives where others cannot read (pyenv's, in /root).

About a minute (pip installs every dependency from scratch); marked `image`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

import proxy
from deploy import dockerfile
from proxy import assets
from proxy.core.wire.decoder import FrameDecoder
from proxy.embedded import free_port
from tests.deploy.rendering import KUSTOMIZE
from tests.fake_upstream import FakeUpstream
from tests.server.conftest import AiohttpServer

pytestmark = pytest.mark.image


def usable_by_others(path: Path) -> bool:
    """Whether any user may run `path`: every directory above it searchable by others."""
    resolved = path.resolve()
    if not resolved.is_file() or resolved.stat().st_mode & stat.S_IXOTH == 0:
        return False
    return all(d.stat().st_mode & stat.S_IXOTH for d in resolved.parents)


def image_python() -> Path:
    """The interpreter to stand in for the image's: one the image's user can run, if any."""
    here = Path(getattr(sys, "_base_executable", sys.executable))
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return next((p for p in (here, system) if usable_by_others(p)), here)


@pytest.fixture(scope="module")
def image() -> Iterator[dockerfile.Image]:
    scratch = Path(tempfile.mkdtemp(prefix="codec-proxy-image-"))
    scratch.chmod(0o755)  # the image's / : the image's user must get in
    try:
        yield dockerfile.build_steps(
            dockerfile.parse(dockerfile.DEFAULT_DOCKERFILE), scratch, python=image_python()
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def image_ids(image: dockerfile.Image) -> tuple[int, int]:
    """The uid and gid of the image's USER (numeric, as the lint requires)."""
    uid, _, gid = image.user.partition(":")
    return int(uid), int(gid or uid)


def as_image_user(argv: list[str], image: dockerfile.Image) -> list[str]:
    """`argv` run as the image's USER, as the container runtime would (needs root)."""
    uid, gid = image_ids(image)
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


def read_only(argv: list[str], root: Path, tmpdir: Path) -> list[str]:
    """`argv` with the image's root read-only and a fresh tmpfs on TMPDIR, as the Kubernetes
    manifests run it (readOnlyRootFilesystem, an emptyDir on /tmp). Needs root for the mount
    namespace."""
    script = 'mount --bind -o ro "$1" "$1" && mount -t tmpfs -o size=64m tmpfs "$2" && shift 2'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            script + ' && exec "$@"', "sh", str(root), str(tmpdir), *argv]  # fmt: skip


def run_in_image(image: dockerfile.Image, *argv: str) -> subprocess.CompletedProcess[str]:
    # From the image's /, as the entry point runs (no WORKDIR): not from this source tree.
    return subprocess.run(
        list(argv),
        env=image.env,
        cwd=image.root,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_image_holds_the_proxy_and_its_runtime_only(image: dockerfile.Image) -> None:
    entry = shutil.which(image.entrypoint[0], path=image.env["PATH"])
    assert entry is not None
    assert Path(entry).is_relative_to(image.root)
    version = run_in_image(image, entry, "--version")
    assert version.stdout.strip() == f"codec-proxy {proxy.__version__}"
    python = str(image.path(image.image_env["VIRTUAL_ENV"]) / "bin" / "python")
    imports = "import aiohttp, msgpack, tokenizers, zstandard, brotli, prometheus_client, proxy"
    assert run_in_image(image, python, "-c", imports).returncode == 0
    # Neither the dev tools nor the embedded backend ship.
    for module in ("pytest", "mypy", "xllamacpp", "kubernetes_validate"):
        assert run_in_image(image, python, "-c", f"import {module}").returncode != 0, module
    # Installed as a package, not pointing back at a source tree.
    where = run_in_image(image, python, "-c", "import proxy; print(proxy.__file__)")
    assert "site-packages" in where.stdout
    # The user is created by a final-stage RUN, which is not run here.
    assert image.skipped
    assert all(step.startswith("useradd") for step in image.skipped)


def healthcheck(image: dockerfile.Image, env: dict[str, str]) -> int:
    """The HEALTHCHECK command's status, run as the image's user as Docker runs it."""
    return subprocess.run(
        as_image_user(image.healthcheck, image),
        env=env,
        cwd=image.root,
        capture_output=True,
        check=False,
    ).returncode


@dataclass
class Container:
    process: subprocess.Popen[str]
    env: dict[str, str]
    port: int
    tmpdir: Path
    files: set[Path]  # under the image's root, outside TMPDIR, when it started


def files_outside(root: Path, tmpdir: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(tmpdir)}


def start_container(image: dockerfile.Image, upstream: str) -> Container:
    # As Kubernetes mounts them: the config file (kustomize's) and the tokenizer; a tmpfs.
    config = image.path("/etc/codec-proxy/codec-proxy.toml")
    config.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(KUSTOMIZE / "base" / "codec-proxy.toml", config)
    models = image.path("/models")
    models.mkdir(exist_ok=True)
    shutil.copy(assets.MISTRAL_TOKENIZER.ensure(), models / "tokenizer.json")
    tmpdir = Path(image.env["TMPDIR"])
    tmpdir.mkdir(exist_ok=True)
    port = free_port()
    env = {
        **image.env,
        # Paths and addresses of this machine; everything else is the image's and the file's.
        "CODEC_PROXY_UPSTREAM": upstream,
        "CODEC_PROXY_TOKENIZER": str(models),
        "CODEC_PROXY_PORT": str(port),
        "CODEC_PROXY_HOST": "127.0.0.1",
        "CODEC_PROXY_DRIFT_CHECK": "off",  # the fake backend does not tokenize
        "HOME": "/nonexistent",
    }
    files = files_outside(image.root, tmpdir)
    assert healthcheck(image, env) != 0  # nothing listens yet
    argv = [*image.entrypoint, *image.cmd, "--config", str(config)]
    process = subprocess.Popen(
        read_only(as_image_user(argv, image), image.root, tmpdir),
        env=env,
        cwd=image.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Container(process, env, port, tmpdir, files)


def wait_healthy(image: dockerfile.Image, container: Container) -> None:
    deadline = time.monotonic() + 60
    while healthcheck(image, container.env) != 0:
        assert container.process.poll() is None, container.process.communicate()[0]
        assert time.monotonic() < deadline, "HEALTHCHECK never passed"
        time.sleep(0.5)


def stop(container: Container) -> str:
    if container.process.poll() is None:
        container.process.kill()
    return container.process.communicate()[0]


def process_identity(pid: int) -> tuple[str, int, int]:
    """A running process's command line, real uid and real gid."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {line.split(":")[0]: line.split()[1:] for line in status}
    return cmdline, int(fields["Uid"][0]), int(fields["Gid"][0])


async def test_serves_health_checks_and_drains_as_the_image_user(
    image: dockerfile.Image, aiohttp_server: AiohttpServer
) -> None:
    if os.geteuid() != 0:
        pytest.skip("running as the image's uid on a read-only root needs root (as in CI)")
    assert usable_by_others(image.path("/usr/local/bin/python")), (
        f"{image_python()}: no interpreter here that uid {image_ids(image)[0]} can run"
    )
    server = await aiohttp_server(FakeUpstream().app())
    upstream = str(server.make_url("")).rstrip("/")
    container = await asyncio.to_thread(start_container, image, upstream)
    try:
        await asyncio.to_thread(wait_healthy, image, container)
        # The process serving is the entry point, as the image's user (unshare, sh and setpriv
        # each exec the next).
        cmdline, uid, gid = process_identity(container.process.pid)
        assert " ".join(image.entrypoint) in cmdline  # the console script, by the venv's python
        assert (uid, gid) == image_ids(image) != (0, 0)
        url = f"http://127.0.0.1:{container.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/readyz") as resp:
                assert resp.status == 200, await resp.text()
            body = {"prompt": "x", "max_tokens": 8, "stream_format": "msgpack"}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                frames = FrameDecoder("msgpack").feed(await resp.read())
        assert frames[-1].done
        assert sum(len(f.ids) for f in frames) > 0
        container.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(container.process.wait, 30) == 0
    finally:
        output = await asyncio.to_thread(stop, container)
    assert "codec-proxy" in output
    assert await asyncio.to_thread(healthcheck, image, container.env) != 0  # down again
    # Nothing was written outside TMPDIR (a read-only root would have refused it).
    after = await asyncio.to_thread(files_outside, image.root, container.tmpdir)
    assert after - container.files == set()
