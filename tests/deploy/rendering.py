"""Render deploy/ (kustomize overlays, Helm chart) and read the result as Kubernetes would run it.

The rendered manifests are read back the way a pod would see them: the container's args are
parsed by the proxy's own command line, its config file is the ConfigMap mounted at the path
those args name, and its environment is the image's ENV, plus the service links Kubernetes would
inject, plus the container's `env`. `effective_settings` then loads settings exactly as
`codec-proxy serve` does.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from deploy import dockerfile
from proxy import cli, config
from proxy.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "codec-proxy"
PROXY_CONTAINER = "codec-proxy"
# Render the chart for the oldest Kubernetes the deployment supports.
KUBE_VERSION = "1.30.0"
# As `helm install codec-proxy ...`: the Service is then named codec-proxy, like kustomize's.
RELEASE = "codec-proxy"

Doc = dict[str, Any]


def run(*cmd: str | Path) -> str:
    """Run a tool; its stdout, or an AssertionError carrying its stderr."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {result.returncode}:\n{result.stderr[-3000:]}"
        )
    return result.stdout


def documents(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(kubectl: Path, overlay: str) -> list[Doc]:
    return documents(run(kubectl, "kustomize", KUSTOMIZE / overlay))


def helm_template(helm: Path, *args: str | Path) -> list[Doc]:
    return documents(
        run(
            helm,
            "template",
            RELEASE,
            CHART,
            "--namespace",
            "inference",
            "--kube-version",
            KUBE_VERSION,
            *args,
        )
    )


@dataclass(frozen=True)
class Target:
    """One deployable rendering of deploy/."""

    name: str
    mode: str  # "standalone" or "sidecar"
    tokenizer_in_image: bool = False  # the tokenizer is baked into a derived image

    def render(self, kubectl: Path, helm: Path) -> list[Doc]:
        tool, _, variant = self.name.partition("/")
        if tool == "kustomize":
            return kustomize(kubectl, f"overlays/{variant}")
        if variant == "defaults":
            return helm_template(helm)
        return helm_template(helm, "-f", CHART / "ci" / f"{variant}-values.yaml")


TARGETS = (
    Target("kustomize/standalone", "standalone", tokenizer_in_image=True),
    Target("kustomize/sidecar", "sidecar"),
    Target("kustomize/multi-model", "standalone"),
    Target("kustomize/inference-pool", "sidecar"),
    Target("helm/defaults", "standalone"),
    Target("helm/standalone", "standalone"),
    Target("helm/sidecar", "sidecar"),
    Target("helm/multimodel", "standalone"),
    Target("helm/inferencepool", "sidecar"),
    # The client side of the two-proxy recipe: a Codec upstream, no tokenizer at all.
    Target("helm/edge", "standalone"),
)


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Pod:
    """The pod template of the Deployment that runs codec-proxy."""

    deployment: Doc

    @property
    def template(self) -> Doc:
        template: Doc = self.deployment["spec"]["template"]
        return template

    @property
    def spec(self) -> Doc:
        spec: Doc = self.template["spec"]
        return spec

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.template["metadata"].get("labels", {})
        return labels

    @property
    def annotations(self) -> dict[str, str]:
        annotations: dict[str, str] = self.template["metadata"].get("annotations", {})
        return annotations

    @property
    def containers(self) -> list[Doc]:
        containers: list[Doc] = self.spec["containers"]
        return containers

    def container(self, name: str = PROXY_CONTAINER) -> Doc:
        found = [c for c in self.containers if c["name"] == name]
        assert len(found) == 1, f"expected one container {name!r}"
        return found[0]

    @property
    def others(self) -> list[Doc]:
        """The containers that are not codec-proxy (the inference engine, in sidecar mode)."""
        return [c for c in self.containers if c["name"] != PROXY_CONTAINER]

    def volume(self, name: str) -> Doc:
        found: list[Doc] = [v for v in self.spec.get("volumes", []) if v["name"] == name]
        assert len(found) == 1, f"expected one volume {name!r}"
        return found[0]

    def mount_for(self, container: Doc, path: str) -> Doc | None:
        """The volumeMount of `container` that holds `path` (the deepest one)."""
        target = PurePosixPath(path)
        mounts = [
            m
            for m in container.get("volumeMounts", [])
            if target == PurePosixPath(m["mountPath"])
            or PurePosixPath(m["mountPath"]) in target.parents
        ]
        return max(mounts, key=lambda m: len(m["mountPath"]), default=None)

    def port(self, container: Doc, port: int | str) -> int:
        """A probe's or Service's port, by number or by the container port's name."""
        if isinstance(port, int):
            return port
        numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
        assert len(numbers) == 1, f"container {container['name']} has no port named {port!r}"
        return int(numbers[0])


def proxy_pod(docs: list[Doc]) -> Pod:
    pods = [
        Pod(d)
        for d in of_kind(docs, "Deployment")
        if any(c["name"] == PROXY_CONTAINER for c in d["spec"]["template"]["spec"]["containers"])
    ]
    assert len(pods) == 1, f"expected one Deployment running {PROXY_CONTAINER}, found {len(pods)}"
    return pods[0]


def mounted_file(docs: list[Doc], pod: Pod, container: Doc, path: str) -> str:
    """The content a container sees at `path`, when a ConfigMap of `docs` is mounted there."""
    mount = pod.mount_for(container, path)
    assert mount is not None, f"nothing is mounted at {path}"
    volume = pod.volume(mount["name"])
    assert "configMap" in volume, f"{path} is on volume {mount['name']}, not a ConfigMap"
    relative = str(PurePosixPath(path).relative_to(mount["mountPath"]))
    key = relative
    for item in volume["configMap"].get("items", []):
        if item["path"] == relative:
            key = item["key"]
    name = volume["configMap"]["name"]
    maps = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
    assert len(maps) == 1, f"ConfigMap {name} is not part of the rendering"
    data: dict[str, str] = maps[0].get("data", {})
    assert key in data, f"ConfigMap {name} has no key {key!r}"
    return data[key]


def image_env() -> dict[str, str]:
    """The environment the image gives every container started from it."""
    parsed = dockerfile.parse(dockerfile.DEFAULT_DOCKERFILE)
    return parsed.env(parsed.final)


def service_links(docs: list[Doc]) -> dict[str, str]:
    """The variables Kubernetes injects for every Service unless enableServiceLinks is false."""
    env: dict[str, str] = {}
    for service in of_kind(docs, "Service"):
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = service["spec"].get("ports", [])
        ip = "10.96.0.10"
        env[f"{name}_SERVICE_HOST"] = ip
        if ports:
            first = ports[0]
            env[f"{name}_SERVICE_PORT"] = str(first["port"])
            env[f"{name}_PORT"] = f"tcp://{ip}:{first['port']}"
        for port in ports:
            prefix = f"{name}_PORT_{port['port']}_TCP"
            env[prefix] = f"tcp://{ip}:{port['port']}"
            env[f"{prefix}_PROTO"] = "tcp"
            env[f"{prefix}_PORT"] = str(port["port"])
            env[f"{prefix}_ADDR"] = ip
    return env


def container_env(container: Doc) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        assert "value" in item, f"env {item['name']}: only literal values can be checked here"
        env[item["name"]] = str(item["value"])
    return env


@dataclass(frozen=True)
class Effective:
    settings: Settings
    config_path: str
    config_text: str


def effective_settings(docs: list[Doc], *, service_links_enabled: bool | None = None) -> Effective:
    """Load settings as `codec-proxy serve` in the rendered pod would."""
    pod = proxy_pod(docs)
    container = pod.container()
    assert "command" not in container, "the image's entry point (codec-proxy serve) must stay"
    args = cli.build_parser().parse_args(["serve", *container.get("args", [])])
    assert args.config is not None, "the container is not given a config file"
    path = str(args.config)
    text = mounted_file(docs, pod, container, path)
    env = dict(image_env())
    links = pod.spec.get("enableServiceLinks", True)
    if service_links_enabled is not None:
        links = service_links_enabled
    if links:
        env.update(service_links(docs))
    env.update(container_env(container))
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / PurePosixPath(path).name
        local.write_text(text)
        settings = config.load(file=local, env=env, flags=config.flags_of(args))
    return Effective(settings, path, text)


def walk(value: Any) -> Iterator[Any]:
    """Every nested value of a document."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)
