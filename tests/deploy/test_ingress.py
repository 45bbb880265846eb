"""The front-proxy recipes in deploy/ingress/ agree with the proxy they sit in front of: its
Service and port, its timeouts and body limit, its readiness route, and what it streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.core.wire.frames import encoder_for
from proxy.server.control.local import readyz
from proxy.settings import MiB, Settings
from tests.deploy.rendering import DEPLOY, Doc, documents, kustomize, one, proxy_pod, walk
from tests.deploy.test_manifests import KUBERNETES_VERSIONS, route_of

INGRESS = DEPLOY / "ingress"
NGINX = "nginx.ingress.kubernetes.io/"

DEFAULTS = Settings(upstream=("http://u",), tokenizer=Path("t"))
# Streamed response types: the Codec frames and the JSON SSE passed through from the backend.
STREAMED_TYPES = {
    encoder_for("msgpack").content_type,
    encoder_for("msgpack", prefixed_msgpack=True).content_type,
    encoder_for("protobuf").content_type,
    "text/event-stream",
}
# The longest a healthy stream may be silent before the proxy itself gives up on the backend.
LONGEST_SILENCE = max(DEFAULTS.ttft_timeout, DEFAULTS.idle_timeout)


def load(relative: str) -> list[Doc]:
    return documents((INGRESS / relative).read_text())


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


@pytest.fixture(scope="module")
def service(kubectl: Path) -> Doc:
    """The Service the recipes point at: kustomize's standalone overlay."""
    return one(kustomize(kubectl, "overlays/standalone"), "Service")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("relative", ["nginx/ingress.yaml", "nginx/controller-configmap.yaml"])
def test_nginx_files_are_valid_kubernetes(relative: str, version: str) -> None:
    for doc in load(relative):
        kubernetes_validate.validate(doc, version, strict=True)


def test_nginx_ingress_streams_to_the_proxy(service: Doc) -> None:
    (ingress,) = load("nginx/ingress.yaml")
    annotations = ingress["metadata"]["annotations"]
    assert annotations[NGINX + "proxy-buffering"] == "off"
    assert annotations[NGINX + "proxy-http-version"] == "1.1"
    assert float(annotations[NGINX + "proxy-read-timeout"]) > LONGEST_SILENCE
    assert float(annotations[NGINX + "proxy-send-timeout"]) > DEFAULTS.write_timeout
    size = annotations[NGINX + "proxy-body-size"]
    assert size.endswith("m")
    assert int(size[:-1]) * MiB >= DEFAULTS.max_body_bytes
    backends = [v for v in walk(ingress["spec"]) if isinstance(v, dict) and "service" in v]
    assert backends
    for backend in backends:
        assert backend["service"]["name"] == service["metadata"]["name"]
        assert backend["service"]["port"]["number"] == service["spec"]["ports"][0]["port"]


def test_nginx_never_gzips_streams() -> None:
    (controller,) = load("nginx/controller-configmap.yaml")
    gzipped = set(controller["data"]["gzip-types"].split())
    assert gzipped
    assert not gzipped & STREAMED_TYPES


def test_gateway_api_route(service: Doc) -> None:
    (gateway,) = load("gateway-api/gateway.yaml")
    (route,) = load("gateway-api/httproute.yaml")
    for doc in (gateway, route):
        assert doc["apiVersion"] == "gateway.networking.k8s.io/v1"
    (listener,) = gateway["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS"  # HTTP/2 to clients is negotiated by ALPN on TLS
    (parent,) = route["spec"]["parentRefs"]
    assert parent == {"name": gateway["metadata"]["name"], "sectionName": listener["name"]}
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend == {
        "name": service["metadata"]["name"],
        "port": service["spec"]["ports"][0]["port"],
    }
    assert seconds(rule["timeouts"]["request"]) == 0  # no limit on a whole generation
    # HTTP/1.1 to the proxy: its Service port says plain http, not h2c.
    assert service["spec"]["ports"][0]["appProtocol"] == "http"


def envoy() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((INGRESS / "envoy" / "envoy.yaml").read_text())
    return config


def test_envoy_speaks_http2_to_clients_and_http11_to_the_proxy() -> None:
    resources = envoy()["static_resources"]
    (listener,) = resources["listeners"]
    (chain,) = listener["filter_chains"]
    tls = chain["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["alpn_protocols"][0] == "h2"
    (cluster,) = resources["clusters"]
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert options["explicit_http_config"] == {"http_protocol_options": {}}


def test_envoy_neither_compresses_nor_cuts_streams() -> None:
    resources = envoy()["static_resources"]
    (chain,) = resources["listeners"][0]["filter_chains"]
    (manager,) = chain["filters"]
    config = manager["typed_config"]
    filters = [f["name"] for f in config["http_filters"]]
    assert filters[-1] == "envoy.filters.http.router"
    assert not [f for f in filters if "compressor" in f or "buffer" in f]
    assert seconds(config["stream_idle_timeout"]) > LONGEST_SILENCE
    routes = [v for v in walk(config["route_config"]) if isinstance(v, dict) and "cluster" in v]
    assert routes
    for route in routes:
        assert seconds(route["timeout"]) == 0
        assert seconds(route["idle_timeout"]) > LONGEST_SILENCE


def test_envoy_targets_the_proxy_and_checks_its_readiness(kubectl: Path, service: Doc) -> None:
    (cluster,) = envoy()["static_resources"]["clusters"]
    (check,) = cluster["health_checks"]
    assert check["http_health_check"]["path"] == route_of(readyz)
    (endpoint,) = [
        v for v in walk(cluster["load_assignment"]) if isinstance(v, dict) and "port_value" in v
    ]
    assert endpoint["address"].startswith(service["metadata"]["name"] + ".")
    (port,) = service["spec"]["ports"]
    assert endpoint["port_value"] == port["port"]
    pod = proxy_pod(kustomize(kubectl, "overlays/standalone"))
    assert pod.port(pod.container(), port["targetPort"]) == DEFAULTS.port
