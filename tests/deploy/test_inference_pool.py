"""The InferencePool examples (kustomize overlay inference-pool, the chart's `inferencePool`) are
valid against the Gateway API Inference Extension's CRD and agree with the proxy: the pool's
pods are the proxy's, its target port the proxy's serving port, and on that port `/metrics` is
relayed to the engine, since the endpoint picker scrapes there (docs/DEPLOY.md "Behind an
endpoint picker")."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema_rs
import pytest
import yaml

from proxy.server.app import routes
from proxy.server.control.generation import other_routes
from tests.deploy.rendering import (
    KUSTOMIZE,
    REPO,
    TARGETS,
    Doc,
    Target,
    effective_settings,
    of_kind,
    proxy_pod,
)

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "gie" / "inferencepools-v1-crd.yaml"
POOL_TARGETS = [t for t in TARGETS if t.name in ("kustomize/inference-pool", "helm/inferencepool")]


def crd_version() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    found: dict[str, Any] = version
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
    )
    return found


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused: the API server prunes them, and `kubectl apply`
    (strict field validation) refuses them, so a misspelled field must fail here too."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "x-kubernetes-preserve-unknown-fields" not in schema:
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [strict(value) for value in schema]
    return schema


def schema_errors(doc: Doc) -> list[str]:
    validator = jsonschema_rs.Draft7Validator(strict(crd_version()["schema"]["openAPIV3Schema"]))
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(doc)]


def cel_rules(schema: Any) -> list[str]:
    """Every `x-kubernetes-validations` rule in the schema (CEL, which no library here runs)."""
    found = []
    if isinstance(schema, dict):
        found += [rule["rule"] for rule in schema.get("x-kubernetes-validations", [])]
        for value in schema.values():
            found += cel_rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found += cel_rules(value)
    return found


# The CRD's CEL rules, each as Python over the spec. A new rule in the CRD fails the test below
# until it is written here.
CEL: dict[str, Callable[[Doc], bool]] = {
    # endpointPickerRef: port is required when kind is 'Service' or unspecified.
    "self.kind != 'Service' || has(self.port)": lambda spec: (
        spec["endpointPickerRef"].get("kind", "Service") != "Service"
        or "port" in spec["endpointPickerRef"]
    ),
    # targetPorts: port numbers are unique.
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": lambda spec: (
        len({p["number"] for p in spec["targetPorts"]}) == len(spec["targetPorts"])
    ),
}


def test_the_crd_rules_are_all_checked() -> None:
    assert sorted(cel_rules(crd_version()["schema"])) == sorted(CEL)


@pytest.fixture(params=POOL_TARGETS, ids=[t.name for t in POOL_TARGETS])
def pool_docs(request: pytest.FixtureRequest, renderings: dict[str, list[Doc]]) -> list[Doc]:
    target: Target = request.param
    return renderings[target.name]


def test_the_pool_is_valid_against_its_crd(pool_docs: list[Doc]) -> None:
    (pool,) = of_kind(pool_docs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert schema_errors(pool) == []
    for rule, holds in CEL.items():
        assert holds(pool["spec"]), rule


def test_the_validation_is_not_vacuous(pool_docs: list[Doc]) -> None:
    (pool,) = of_kind(pool_docs, "InferencePool")
    damages: list[Callable[[Doc], object]] = [
        lambda spec: spec.update(targetPorts=[]),
        lambda spec: spec.update(targetPort=[{"number": 8080}]),  # misspelled
        lambda spec: spec["targetPorts"].append({"number": 70000}),
        lambda spec: spec.update(appProtocol="h2"),
        lambda spec: spec.pop("selector"),
    ]
    for damage in damages:
        broken = copy.deepcopy(pool)
        damage(broken["spec"])
        assert schema_errors(broken), broken["spec"]
    doubled = copy.deepcopy(pool)
    doubled["spec"]["targetPorts"] *= 2
    assert not all(holds(doubled["spec"]) for holds in CEL.values())


def test_the_pool_routes_to_the_proxy_which_relays_the_engines_metrics(
    pool_docs: list[Doc],
) -> None:
    settings = effective_settings(pool_docs).settings
    pod = proxy_pod(pool_docs)
    (pool,) = of_kind(pool_docs, "InferencePool")
    spec = pool["spec"]
    # The pool's pods are the pods the proxy runs in, and only those.
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= pod.labels.items()
    others = [d for d in of_kind(pool_docs, "Deployment") if d is not pod.deployment]
    assert all(not selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
               for d in others)  # fmt: skip
    # Its target port is the proxy's serving port, never the engine's.
    assert [p["number"] for p in spec["targetPorts"]] == [settings.port]
    engine_ports = {urlsplit(url).port for m in settings.model_list() for url in m.upstreams}
    assert settings.port not in engine_ports
    assert spec["appProtocol"] == "http"
    # The picker scrapes /metrics at that port: there the proxy relays it to the engine, which
    # it does only with an admin port for its own.
    assert settings.admin_port is not None
    served = {(r.method, r.path): r.handler for r in routes(probes=settings.admin_port is None)}
    assert ("GET", "/metrics") not in served
    assert served[("*", "/{tail:.*}")] is other_routes
    picker = spec["endpointPickerRef"]
    assert picker["name"]
    assert picker["port"]["number"]


def test_the_documented_pool_is_the_overlays() -> None:
    """docs/DEPLOY.md shows the pool CI validates, not another one."""
    text = (REPO / "docs" / "DEPLOY.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    shown = [yaml.safe_load(b) for b in blocks if "kind: InferencePool" in b]
    overlay = yaml.safe_load(
        (KUSTOMIZE / "overlays" / "inference-pool" / "inferencepool.yaml").read_text()
    )
    assert shown == [overlay]
