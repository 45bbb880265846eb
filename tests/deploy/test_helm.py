"""The Helm chart: lint and render with helm 3 and helm 4, values that map onto real settings,
and bad values refused before anything reaches a cluster."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

import proxy
from deploy import helm_schema
from proxy.settings import ModelSettings, Settings
from tests.deploy.rendering import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    Doc,
    effective_settings,
    helm_template,
    proxy_pod,
)

VALUES = (None, "standalone", "sidecar", "multimodel", "inferencepool", "edge")  # None: defaults
VALUE_IDS = ["defaults", "standalone", "sidecar", "multimodel", "inferencepool", "edge"]


def values_args(name: str | None) -> list[str | Path]:
    return [] if name is None else ["-f", CHART / "ci" / f"{name}-values.yaml"]


def helm_fails(helm: Path, *args: str | Path) -> str:
    """Render expecting a refusal; helm's error message."""
    result = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
        + [str(a) for a in args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0, f"helm rendered {args} without complaint"
    return result.stderr


@pytest.fixture(params=["helm4", "helm3"])
def any_helm(request: pytest.FixtureRequest, helm: Path, helm3: Path) -> Path:
    return helm if request.param == "helm4" else helm3


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_helm_lint_strict(any_helm: Path, values: str | None) -> None:
    result = subprocess.run(
        [str(any_helm), "lint", str(CHART), "--strict", *map(str, values_args(values))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    # Lint does not stop at a template's `fail`: helm 3 logs "Fail: ...", helm 4 "funcMap fail".
    output = result.stdout + result.stderr
    assert "Fail:" not in output, output
    assert "funcMap fail" not in output, output


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_helm3_and_helm4_render_the_same(helm: Path, helm3: Path, values: str | None) -> None:
    rendered = helm_template(helm, *values_args(values))
    assert rendered == helm_template(helm3, *values_args(values))


def test_the_schema_lists_every_setting_the_chart_does_not_set() -> None:
    assert helm_schema.main(["--check"]) == 0
    schema = json.loads(helm_schema.SCHEMA.read_text())
    config = schema["properties"]["config"]["properties"]
    names = [f.name for f in dataclasses.fields(Settings)]
    secret = helm_schema.secret_settings()
    assert sorted(config) == sorted(set(names) - set(helm_schema.MANAGED) - set(secret))
    assert set(helm_schema.MANAGED) <= set(names)
    # A `models` entry takes every key of the config file's entries.
    entry = schema["properties"]["models"]["items"]
    assert list(entry["properties"]) == [f.name for f in dataclasses.fields(ModelSettings)]
    # A Codec upstream's model has no tokenizer; the chart refuses a JSON one's missing.
    assert entry["required"] == ["name", "upstreams"]
    version = typing.get_type_hints(Settings)["version_policy"]
    assert typing.get_origin(version) is Literal
    assert schema["properties"]["policy"]["properties"]["version"]["enum"] == list(
        typing.get_args(version)
    )


def example(name: str) -> Any:
    """A value for a setting that differs from its default and passes its checks."""
    field = {f.name: f for f in dataclasses.fields(Settings)}[name]
    value = field.default
    kind = typing.get_type_hints(Settings)[name]
    if typing.get_origin(kind) is Literal:
        return next(v for v in typing.get_args(kind) if v != value)
    if typing.get_origin(kind) is tuple:
        return ["msgpack=/etc/codec-proxy/dictionaries/m.zstd"]  # zstd_dicts
    if isinstance(value, Path):
        return "/etc/codec-proxy/dictionaries/manifest.json"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        maximum = field.metadata["option"].maximum
        return value + 1 if maximum is None or value + 1 <= maximum else maximum
    if int in typing.get_args(kind):
        return 4096  # an optional integer (max_prompt_ids)
    if name == "health_path":
        return "/v1/health"
    if field.metadata["option"].url:
        return "https://models.example.com"
    return "example"  # the optional strings: model, map_id


def test_every_other_setting_reaches_the_config_file(helm: Path) -> None:
    skipped = {*helm_schema.MANAGED, *helm_schema.secret_settings()}
    names = [f.name for f in dataclasses.fields(Settings) if f.name not in skipped]
    wanted = {name: example(name) for name in names}
    docs = helm_template(helm, "--set-json", f"config={json.dumps(wanted)}")
    settings = effective_settings(docs).settings
    for name, value in wanted.items():
        actual = getattr(settings, name)
        if isinstance(actual, Path):
            actual = str(actual)
        assert actual == (tuple(value) if isinstance(value, list) else value), name


@pytest.mark.parametrize("name", helm_schema.MANAGED)
def test_settings_the_chart_sets_are_refused_under_config(helm: Path, name: str) -> None:
    value = json.dumps({name: "x"})
    # The schema refuses them; so does the template when the schema is skipped.
    assert "config" in helm_fails(helm, "--set-json", f"config={value}")
    message = helm_fails(helm, "--set-json", f"config={value}", "--skip-schema-validation")
    assert f"config.{name} is set by the chart" in message


@pytest.mark.parametrize("name", helm_schema.secret_settings())
def test_secrets_are_refused_under_config(helm: Path, name: str) -> None:
    value = json.dumps({name: ["k"]})
    assert "config" in helm_fails(helm, "--set-json", f"config={value}")
    message = helm_fails(helm, "--set-json", f"config={value}", "--skip-schema-validation")
    assert f"config.{name} is a secret" in message
    assert f"CODEC_PROXY_{name.upper()}" in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "mode=daemonset"], "mode"),
        (["--set", "config.workers=0"], "workers"),
        (["--set", "config.bogus=1"], "bogus"),
        (["--set", "config.log_format=xml"], "log_format"),
        (["--set-json", "upstream=[]"], "upstream"),
        (["--set-json", 'upstream=["vllm:8000"]'], "upstream"),
        (["--set", "tokenizer.source=configMap"], "tokenizer.configMap.name"),
        (["--set", "tokenizer.source=image", "--set", "tokenizer.path=t.json"], "absolute"),
        (["--set", "policy.safety.enforce=true"], "policy.safety.existingSecret"),
        (["--set", "terminationGracePeriodSeconds=45"], "terminationGracePeriodSeconds"),
        (["--set", "mode=sidecar"], "sidecar.podTemplate.spec.containers"),
        (["--set", "tokenizer.existingVolume=weights", *map(str, values_args("sidecar"))],
         "no volume weights"),
        (["--set", "adminPort=8080"], "adminPort must differ from port"),
        (["--set", "adminPort=0"], "adminPort"),
        # Behind an endpoint picker: the inference pods, with the engine's metrics relayed.
        (["--set", "inferencePool.enabled=true", "--set", "adminPort=8081",
          "--set", "inferencePool.endpointPicker.name=epp"], "needs mode: sidecar"),
        (["--set", "adminPort=null", *map(str, values_args("inferencepool"))],
         "inferencePool.enabled needs adminPort"),
        (["--set", "inferencePool.endpointPicker.name=", *map(str, values_args("inferencepool"))],
         "inferencePool.endpointPicker.name"),
        # A Codec upstream's map is the tokenizer: one given too is refused, not ignored.
        (["--set", "tokenizer.path=tokenizer.json", *map(str, values_args("edge"))],
         "leave tokenizer at its default"),
        (["--set", "upstreamProtocol=grpc"], "upstreamProtocol"),
        (["--set-json", 'models[0].upstream_protocol="codec"',
          *map(str, values_args("multimodel"))],
         "models[0].tokenizer: model llama-3.1-8b's upstream speaks Codec"),
    ],
)  # fmt: skip
def test_bad_values_are_refused(helm: Path, args: list[str], message: str) -> None:
    assert message in helm_fails(helm, *args)


def sidecar_values(tmp_path: Path, **changes: Any) -> Path:
    values = yaml.safe_load((CHART / "ci" / "sidecar-values.yaml").read_text())
    values.update(changes)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_sidecar_injection_keeps_the_engines_pod(helm: Path, tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "ci" / "sidecar-values.yaml").read_text())
    template = values["sidecar"]["podTemplate"]
    pod = proxy_pod(helm_template(helm, *values_args("sidecar")))
    (engine,) = pod.others
    (original,) = template["spec"]["containers"]
    # The engine's container is kept as it is, plus a preStop sleep holding it for the drain.
    assert {k: v for k, v in engine.items() if k != "lifecycle"} == original
    assert "lifecycle" in engine
    assert pod.spec["securityContext"] == template["spec"]["securityContext"]
    names = [v["name"] for v in pod.spec["volumes"]]
    assert names[: len(template["spec"]["volumes"])] == [
        v["name"] for v in template["spec"]["volumes"]
    ]
    assert pod.labels.items() >= template["metadata"]["labels"].items()
    # An engine with a lifecycle of its own keeps it.
    original["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/true"]}}}
    path = sidecar_values(tmp_path, sidecar=values["sidecar"])
    (engine,) = proxy_pod(helm_template(helm, "-f", path)).others
    assert engine["lifecycle"] == original["lifecycle"]


@pytest.mark.parametrize(
    ("values", "path", "volume"),
    [
        ({}, "/models", "persistentVolumeClaim"),
        ({"tokenizer": {"path": "llama/tokenizer.json"}}, "/models/llama/tokenizer.json", None),
        ({"tokenizer": {"source": "configMap", "configMap": {"name": "tok", "key": "t.json"}}},
         "/models/t.json", "configMap"),
        ({"tokenizer": {"source": "image", "path": "/opt/tokenizer/tokenizer.json"}},
         "/opt/tokenizer/tokenizer.json", None),
    ],
)  # fmt: skip
def test_tokenizer_sources(
    helm: Path, tmp_path: Path, values: dict[str, Any], path: str, volume: str | None
) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    docs = helm_template(helm, "-f", file)
    assert str(effective_settings(docs).settings.tokenizer) == path
    pod = proxy_pod(docs)
    mount = pod.mount_for(pod.container(), path)
    source = values.get("tokenizer", {}).get("source", "volume")
    if source == "image":
        assert mount is None
        assert all(v["name"] != "codec-proxy-tokenizer" for v in pod.spec["volumes"])
        return
    assert mount is not None
    assert mount["readOnly"] is True
    if volume is not None:
        assert volume in pod.volume(mount["name"])


def test_a_codec_upstreams_model_beside_others_loads_no_tokenizer(
    helm: Path, tmp_path: Path
) -> None:
    values = yaml.safe_load((CHART / "ci" / "multimodel-values.yaml").read_text())
    edge = {"name": "far-away", "upstreams": ["https://codec.example.com"],
            "upstream_protocol": "codec"}  # fmt: skip
    values["models"].append(edge)
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    docs = helm_template(helm, "-f", file)
    models = {m.name: m for m in effective_settings(docs).settings.model_list()}
    assert models["far-away"].upstream_protocol == "codec"
    assert models["far-away"].tokenizer is None
    others = [m for name, m in models.items() if name != "far-away"]
    assert all(m.upstream_protocol == "json" and m.tokenizer is not None for m in others)
    pod = proxy_pod(docs)
    assert all(pod.mount_for(pod.container(), str(m.tokenizer)) is not None for m in others)
    # The fourth entry's would be codec-proxy-tokenizer-3: there is none.
    names = [v["name"] for v in pod.spec["volumes"]]
    assert "codec-proxy-tokenizer-0" in names
    assert "codec-proxy-tokenizer-3" not in names


def test_image_by_digest(helm: Path) -> None:
    digest = "sha256:" + "ab" * 32
    docs = helm_template(helm, "--set", f"image.digest={digest}")
    assert proxy_pod(docs).container()["image"] == f"codec-proxy@{digest}"


def test_chart_kustomize_and_image_carry_the_proxys_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == proxy.__version__
    base = yaml.safe_load(
        (CHART.parents[1] / "kubernetes" / "base" / "kustomization.yaml").read_text()
    )
    assert base["images"][0]["newTag"] == proxy.__version__
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    assert f"ARG VERSION={proxy.__version__}" in dockerfile


def test_objects_are_named_after_the_release(helm: Path) -> None:
    docs: list[Doc] = helm_template(helm)
    # Release codec-proxy: the Service the ingress examples point at is named codec-proxy.
    assert {d["metadata"]["name"] for d in docs} == {RELEASE}
