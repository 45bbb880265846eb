"""Every rendering of deploy/ (kustomize overlays, Helm modes) is valid Kubernetes and agrees
with the proxy: probe paths are its routes, ports its port, termination outlasts its drain, and
its config file passes its own loader. Expected values come from proxy/, never from here."""

from __future__ import annotations

import dataclasses
from ipaddress import ip_address
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

from proxy.core.errors import ConfigError
from proxy.server.app import routes
from proxy.server.control.local import livez, readyz
from proxy.server.control.local import metrics as metrics_handler
from proxy.server.data import drain as lifecycle
from proxy.server.process import runner
from proxy.settings import Settings
from tests.deploy.rendering import (
    Doc,
    Target,
    effective_settings,
    image_env,
    kustomize,
    of_kind,
    one,
    proxy_pod,
)

# The oldest Kubernetes these manifests are for, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
# Custom resources: their schemas are not Kubernetes'. A ServiceMonitor's fields are checked in
# test_metrics_*, an InferencePool against its CRD in test_inference_pool.py.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
}


def default(name: str) -> Any:
    return {f.name: f.default for f in dataclasses.fields(Settings)}[name]


def route_of(handler: Any) -> str:
    """The one GET path the proxy serves with `handler`."""
    paths = [r.path for r in routes() if r.handler is handler and r.method == "GET"]
    assert len(paths) == 1, f"{handler.__name__} is served at {paths}"
    return paths[0]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_is_valid_kubernetes(docs: list[Doc], version: str) -> None:
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        # Strict: an unknown field (a typo such as `readinesProbe`) is an error, not ignored.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_the_config_file_passes_the_proxys_loader(target: Target, docs: list[Doc]) -> None:
    effective = effective_settings(docs)  # raises ConfigError on any unknown or bad key
    settings = effective.settings
    assert ip_address(settings.host).is_unspecified, "the proxy must listen on the pod's IP"
    # Every model's tokenizer is provided: on a volume mounted into the container, or in the
    # image; but a Codec upstream's model has none (its upstream's map is its tokenizer).
    pod = proxy_pod(docs)
    for model in settings.model_list():
        if model.upstream_protocol == "codec":
            assert model.tokenizer is None
            assert not [m for m in pod.container()["volumeMounts"] if "tokenizer" in m["name"]]
            continue
        mount = pod.mount_for(pod.container(), str(model.tokenizer))
        if target.tokenizer_in_image:
            assert mount is None
        else:
            assert mount is not None, f"{model.name}: tokenizer {model.tokenizer} is on no volume"
            assert mount.get("readOnly") is True


def test_upstream_is_the_pods_engine_or_a_cluster_service(target: Target, docs: list[Doc]) -> None:
    settings = effective_settings(docs).settings
    pod = proxy_pod(docs)
    hosts = [urlsplit(url) for model in settings.model_list() for url in model.upstreams]
    if target.mode == "sidecar":
        (url,) = hosts
        assert url.hostname == "127.0.0.1"
        # The engine listens there, on the loopback only, and publishes no port.
        (engine,) = pod.others
        args = engine.get("args", [])
        assert args[args.index("--host") + 1] == "127.0.0.1"
        assert args[args.index("--port") + 1] == str(url.port)
        assert "ports" not in engine
    else:
        assert pod.others == []
        assert all(h.hostname and h.hostname.endswith(".svc.cluster.local") for h in hosts)


def test_probes_are_the_proxys_own_routes_on_its_port(docs: list[Doc]) -> None:
    """On the admin port when there is one: the serving port relays these paths upstream."""
    settings = effective_settings(docs).settings
    pod = proxy_pod(docs)
    container = pod.container()
    probes = {
        "readinessProbe": route_of(readyz),
        "livenessProbe": route_of(livez),
        "startupProbe": route_of(livez),
    }
    for probe, path in probes.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert pod.port(container, get["port"]) == settings.probe_port, probe


def test_the_container_ports_are_the_settings_ports(docs: list[Doc]) -> None:
    settings = effective_settings(docs).settings
    assert settings.port == default("port")
    container = proxy_pod(docs).container()
    ports = {port["containerPort"]: port for port in container["ports"]}
    wanted = {settings.port} | ({settings.admin_port} - {None})
    assert set(ports) == wanted
    assert all(port["protocol"] == "TCP" for port in ports.values())


def test_the_service_exposes_the_proxys_ports_only(docs: list[Doc]) -> None:
    settings = effective_settings(docs).settings
    pod = proxy_pod(docs)
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= pod.labels.items()
    serving, *admin = service["spec"]["ports"]
    assert pod.port(pod.container(), serving["targetPort"]) == settings.port
    # The admin port only for a ServiceMonitor to select.
    assert [pod.port(pod.container(), p["targetPort"]) for p in admin] in (
        [],
        [settings.admin_port],
    )
    for port in service["spec"]["ports"]:
        # HTTP/1.1 to the proxy: the only protocol it speaks (Gateway API reads appProtocol).
        assert port["appProtocol"] == "http"


def test_metrics_are_scraped_from_the_proxy(docs: list[Doc]) -> None:
    settings = effective_settings(docs).settings
    pod = proxy_pod(docs)
    path = route_of(metrics_handler)
    annotations = pod.annotations
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.probe_port)
    assert annotations["prometheus.io/path"] == path
    for monitor in of_kind(docs, "ServiceMonitor"):
        service = one(docs, "Service")
        labels = monitor["spec"]["selector"]["matchLabels"]
        assert labels.items() <= service["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == path
        ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
        assert pod.port(pod.container(), ports[endpoint["port"]]) == settings.probe_port


def prestop_sleep(container: Doc) -> int:
    seconds: int = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    return seconds


def test_termination_outlasts_prestop_and_drain(target: Target, docs: list[Doc]) -> None:
    settings = effective_settings(docs).settings
    assert settings.drain_timeout == default("drain_timeout")
    pod = proxy_pod(docs)
    grace = pod.spec["terminationGracePeriodSeconds"]
    prestop = prestop_sleep(pod.container())
    assert prestop > 0
    # After SIGTERM: the drain, then streams still open get their terminal frame, then aiohttp
    # closes what is left (proxy/server/process/runner.py).
    closing = lifecycle.CANCEL_GRACE + runner.SHUTDOWN_GRACE
    assert grace > prestop + settings.drain_timeout + closing
    # The engine beside the proxy keeps generating until the proxy has drained.
    for engine in pod.others:
        assert prestop_sleep(engine) >= prestop + settings.drain_timeout
        assert grace > prestop_sleep(engine)


def test_pods_are_locked_down(target: Target, docs: list[Doc]) -> None:
    pod = proxy_pod(docs)
    pod_context = pod.spec.get("securityContext", {})
    for container in pod.containers:
        context = {**pod_context, **container.get("securityContext", {})}
        name = container["name"]
        assert context.get("runAsNonRoot") is True, name
        assert context.get("runAsUser", 1) != 0, name
        assert context.get("allowPrivilegeEscalation") is False, name
        assert context.get("readOnlyRootFilesystem") is True, name
        assert "ALL" in context.get("capabilities", {}).get("drop", []), name
    # The read-only root leaves TMPDIR (the image's) as the proxy's one writable place.
    container = pod.container()
    tmpdir = image_env()["TMPDIR"]
    mount = pod.mount_for(container, tmpdir)
    assert mount is not None
    assert PurePosixPath(mount["mountPath"]) == PurePosixPath(tmpdir)
    assert "emptyDir" in pod.volume(mount["name"])
    assert not mount.get("readOnly", False)
    assert pod.spec["enableServiceLinks"] is False
    if target.mode == "standalone":
        assert pod.spec["automountServiceAccountToken"] is False


def test_service_links_would_break_the_proxy(kubectl: Path) -> None:
    """Why every pod sets enableServiceLinks: false (checked above): Kubernetes would inject
    CODEC_PROXY_PORT=tcp://... for the Service named codec-proxy."""
    docs = kustomize(kubectl, "overlays/standalone")
    with pytest.raises(ConfigError, match="CODEC_PROXY_"):
        effective_settings(docs, service_links_enabled=True)


def test_every_container_has_requests_and_limits(docs: list[Doc]) -> None:
    for container in proxy_pod(docs).containers:
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_budget_and_autoscaler_cover_the_pods(target: Target, docs: list[Doc]) -> None:
    pod = proxy_pod(docs)
    budget = one(docs, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod.labels.items()
    autoscalers = of_kind(docs, "HorizontalPodAutoscaler")
    if target.mode == "sidecar":
        # Accelerator pods scale on the engine's signals; one pod at a time, no surge.
        assert autoscalers == []
        assert pod.deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    else:
        (autoscaler,) = autoscalers
        assert autoscaler["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": pod.deployment["metadata"]["name"],
        }
        assert "replicas" not in pod.deployment["spec"]  # the autoscaler owns it
        assert pod.deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_kustomize_base_holds_the_five_resources(kubectl: Path) -> None:
    docs = kustomize(kubectl, "base")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]
    )
    # Not deployable alone: the overlays name the upstream.
    with pytest.raises(ConfigError, match="'upstream' is required"):
        effective_settings(docs)
